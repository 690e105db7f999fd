"""Feeding tokens into a model's paged cache: the longest reusable prefix, and prompt-length feeds in chunks."""
from __future__ import annotations

from collections.abc import Callable

import torch

from engine.model.kv_cache import KVPool
from engine.model.transformer import Transformer

PREFILL_CHUNK = 512  # long prompts go through in chunks to bound the attention mask's memory


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


def forward_chunked(model: Transformer, pool: KVPool, seq: int, ids: list[int], device,
                    stop: Callable[[], bool] | None = None, head_rows: bool = False) -> torch.Tensor | None:
    """Append ids to seq's cache and return the last position's logits (V,), or a trimmed head's own rows with
    head_rows (Transformer.forward).

    If a chunk's forward pass fails (e.g. out of memory), that chunk's positions are given back before the
    error propagates: the cache never claims positions whose KV was not written. Earlier chunks stay.
    `stop` is asked before every chunk after the first (a long prompt takes many seconds): when it says so, the
    chunks done stay in the cache and None is returned.
    """
    logits = None
    for s in range(0, len(ids), PREFILL_CHUNK):
        if s and stop is not None and stop():
            return None
        chunk = ids[s : s + PREFILL_CHUNK]
        start, end = pool.manager.append(seq, len(chunk))
        x = torch.tensor(chunk, dtype=torch.long, device=device)
        try:
            logits = model(x, start, pool.view(seq, start, end), last_only=True, head_rows=head_rows)
        except BaseException:
            pool.manager.truncate_to(seq, start)
            raise
    assert logits is not None
    return logits[0]
