"""Feeding tokens into a model's paged cache: the longest reusable prefix, and prompt-length feeds in chunks."""
from __future__ import annotations

from collections.abc import Callable

import torch

from engine.model.kv_cache import KVPool
from engine.model.transformer import Transformer

# Long prompts go through in chunks: that bounds the attention mask's memory, and a chunk is as long as a cancel
# waits and as far apart as the window's word on the reading is. The embedded 1.5B target reads a chunk of 64 in
# 1.3 s of one Zen 3 core, ~0.7 s on two (a chunk of 512 took over 5 s), more deep into a long prompt as attention
# grows; a GPU reads a chunk of 512 in milliseconds.
# Fixed per device, never timed: the cache's bits must not depend on how busy the machine was.
PREFILL_CHUNK = 64
GPU_PREFILL_CHUNK = 512


def chunk_tokens(device) -> int:
    """The prefill chunk's length in tokens on `device`."""
    return PREFILL_CHUNK if torch.device(device).type == "cpu" else GPU_PREFILL_CHUNK


PREFIX_BLOCK = 64  # ids compared as one slice before the walk id by id


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading ids a and b share. The hybrid drafter asks every round (the draft cache against the
    committed ids, the lookup's history against them), where one list nearly always extends the other: slices
    compare in C, an order of magnitude faster than a walk id by id in Python, whose cost grew with the context."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    i = 0
    while i + PREFIX_BLOCK <= n and a[i : i + PREFIX_BLOCK] == b[i : i + PREFIX_BLOCK]:
        i += PREFIX_BLOCK
    while i < n and a[i] == b[i]:
        i += 1
    return i


def forward_chunked(model: Transformer, pool: KVPool, seq: int, ids: list[int], device,
                    stop: Callable[[], bool] | None = None, head_rows: bool = False,
                    progress: Callable[[int], None] | None = None) -> torch.Tensor | None:
    """Append ids to seq's cache and return the last position's logits (V,), or a trimmed head's own rows with
    head_rows (Transformer.forward).

    If a chunk's forward pass fails (e.g. out of memory), that chunk's positions are given back before the
    error propagates: the cache never claims positions whose KV was not written. Earlier chunks stay.
    `stop` is asked before every chunk after the first (a long prompt takes many seconds): when it says so, the
    chunks done stay in the cache and None is returned. `progress` is told the tokens fed so far after every
    chunk, so the window can say how far a long prompt has been read.
    """
    logits = None
    step = chunk_tokens(device)
    for s in range(0, len(ids), step):
        if s and stop is not None and stop():
            return None
        chunk = ids[s : s + step]
        start, end = pool.manager.append(seq, len(chunk))
        x = torch.tensor(chunk, dtype=torch.long, device=device)
        try:
            logits = model(x, start, pool.view(seq, start, end), last_only=True, head_rows=head_rows)
        except BaseException:
            pool.manager.truncate_to(seq, start)
            raise
        if progress is not None:
            progress(s + len(chunk))
    assert logits is not None
    return logits[0]
