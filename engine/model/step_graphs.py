"""Short passes on a GPU, replayed as CUDA graphs.

Run eagerly, a decode step of the embedded target launches a small kernel from Python for each of ~45 operations a
layer, and the launching, not the GPU, sets its time (16-24 ms on an H200, 4.5 ms as a graph: README, Performance).
A graph launches them all at once. It fixes every shape and address, so a captured pass runs through a SlotView:
each row attends over every position its sequence can reach, with tensors of one shape whatever the pass's length,
which also keeps a verify pass's rows bitwise a plain step's. One graph is captured per row count and output form, on
first use; inputs go through static buffers. All of a model's graphs share one memory pool, so each output is
copied out at once, before another graph can reuse its memory.
"""
from __future__ import annotations

import logging
import os
from collections.abc import Callable

import torch

from engine.api.config import ModelConfig
from engine.model.attention import ROW_WISE_MAX, padded_rows
from engine.model.kv_cache import CacheView, KVPool
from engine.model.slot_view import SlotView, slot_map

Scores = Callable[[torch.Tensor, SlotView, bool], torch.Tensor]  # Transformer.scores: (ids, view, last_only)

log = logging.getLogger(__name__)


def graphs_wanted() -> bool:
    """SPECLENS_CUDA_GRAPHS=0 runs short passes eagerly on a GPU (for A/B timings)."""
    return os.environ.get("SPECLENS_CUDA_GRAPHS", "1") != "0"


@torch.inference_mode()
def rows_keep_their_bits(heads: int, kv_heads: int, head_dim: int, length: int, device: torch.device | str,
                         dtype: torch.dtype) -> bool:
    """Whether padded_rows gives each row the same bits wherever among the padded rows it sits and whatever the
    others hold: a captured pass scores a plain step's row at index 0 and a verify pass's i-th at index i. A library
    picks its kernel by shape, not by values, so random values do for the probe (as engine.model.row_padding's)."""
    gen = torch.Generator(device=device).manual_seed(0)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device, dtype=dtype)

    q = rand(ROW_WISE_MAX, heads, head_dim)  # (R, H, D)
    keys, values = rand(kv_heads, length, head_dim), rand(kv_heads, length, head_dim)  # (Hkv, S, D)
    bias = torch.zeros(ROW_WISE_MAX, length, device=device)
    together = padded_rows(q, keys, values, bias)  # (R, H * D)
    for r in range(ROW_WISE_MAX):
        alone = torch.zeros_like(q)
        alone[0] = q[r]
        if not torch.equal(padded_rows(alone, keys, values, bias)[0], together[r]):
            return False
    return True


def exact_graphs(cfg: ModelConfig, max_len: int, device: torch.device | str, dtype: torch.dtype) -> StepGraphs | None:
    """CUDA graphs for a model's short passes, unless their attention would give a row other bits by its place in
    the pass: then None, and the eager passes, which attend row by row, keep greedy speculation exact."""
    if rows_keep_their_bits(cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, max_len, device, dtype):
        return StepGraphs()
    log.warning("CUDA graphs off: this GPU's batched attention rounds a row by its place in the pass")
    return None


class StepGraphs:
    """A model's passes of up to ROW_WISE_MAX tokens. capture=False runs the same fixed-shape passes without
    graphs: the CPU's tests check them that way, and a GPU falls back to it if a capture fails."""

    def __init__(self, capture: bool = True) -> None:
        self.capture = capture
        self.captured: dict[tuple[int, bool], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._pool: KVPool | None = None

    def run(self, scores: Scores, ids: torch.Tensor, cache: CacheView, last_only: bool) -> torch.Tensor:
        """ids (T,) written at cache's positions -> the LM head's rows (T, ...) or (1, ...), as `scores` (the model's
        Transformer.scores, passed in on each call so that the model and its graphs hold no reference cycle: a
        model dropped frees its GPU memory at once)."""
        self._bind(cache.pool)
        T = len(ids)
        self._ids[:T].copy_(ids)
        table = cache.pool.manager.block_table(cache.seq)
        pad = [0] * (len(self._meta) - 1 - len(table))
        self._meta.copy_(torch.tensor([cache.end - T, *table, *pad]))  # the pass's start, then its block table
        key = (T, last_only)
        if not self.capture:
            return self._body(scores, *key)
        if key not in self.captured:
            self._warm_up(scores, *key)
            try:
                self.captured[key] = self._record(scores, *key)
            except torch.cuda.OutOfMemoryError:
                raise
            except RuntimeError as e:  # an op that cannot be captured: the same passes, eagerly
                log.warning("CUDA graph capture failed (%s); short passes run eagerly", e)
                self.capture = False
                return self._body(scores, *key)
        graph, out = self.captured[key]
        graph.replay()
        return out.clone()

    def _bind(self, pool: KVPool) -> None:
        """Static buffers for passes over `pool`; graphs recorded over another pool's addresses are dropped."""
        if pool is self._pool:
            return
        m, dev = pool.manager, pool.k.device
        self.captured.clear()
        self._pool = pool
        self._ids = torch.zeros(ROW_WISE_MAX, dtype=torch.long, device=dev)  # (16,)
        self._meta = torch.zeros(1 + -(-m.max_seq_len // m.block_size), dtype=torch.long, device=dev)  # (1 + blocks,)
        if self.capture:
            self._mempool = torch.cuda.graph_pool_handle()
            self._stream = torch.cuda.Stream(dev)

    def _body(self, scores: Scores, T: int, last_only: bool) -> torch.Tensor:
        m = self._pool.manager
        view = SlotView(self._pool, self._meta[:1], T, slot_map(self._meta[1:], m.block_size, m.max_seq_len))
        return scores(self._ids[:T], view, last_only)

    def _warm_up(self, scores: Scores, T: int, last_only: bool) -> None:
        """One run on the capture's stream first: libraries set up their handles and workspaces outside capture.
        It writes the KV that the replay writes again, bit for bit."""
        side = self._stream
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self._body(scores, T, last_only)
        torch.cuda.current_stream().wait_stream(side)

    def _record(self, scores: Scores, T: int, last_only: bool) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._mempool, stream=self._stream, capture_error_mode="thread_local"):
            out = self._body(scores, T, last_only)
        log.debug("captured a CUDA graph of %d rows (last only: %s)", T, last_only)
        return graph, out
