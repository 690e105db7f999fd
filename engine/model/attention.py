"""Causal attention over the cached keys, batch-invariant where speculation needs it.

A verify pass scores K+1 positions at once where plain decoding scores them one at a time. For greedy
speculative output to equal plain greedy exactly (not merely up to near-ties), each position's attention must
produce the same bits either way. A fused kernel over T queries does not promise that: its blocking and its
masked softmax depend on T. So short passes (decode steps and verify passes) attend one query at a time,
each over exactly the keys it may see, with tensors of the same shapes whatever T is. Long passes (prompt
prefill, identical in both modes) use the fused kernel. A windowed layer's row sees only the keys in its window: in
the row-wise passes by slicing (its shapes then depend on the window, never on T), in the fused one by a band mask.
A captured CUDA graph fixes every shape, so there each row attends over all the positions the cache can hold, with
those it may not see (past it, or before its window) masked out, and a pass's rows are padded to ROW_WISE_MAX so
that one matmul scores them all (`padded_rows`).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

ROW_WISE_MAX = 16  # up to this many queries (K + 1 <= 16) attend row by row


def causal_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, window: int | None = None,
                     scale: float | None = None) -> torch.Tensor:
    """q (T, H, D) for the last T of S positions; keys, values (Hkv, S, D) -> (T, H * D). With a window W, the
    query at position p sees keys p - W + 1 .. p only; scale defaults to 1/sqrt(D)."""
    T, H, D = q.shape
    Hkv, S, _ = keys.shape
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    if T <= ROW_WISE_MAX:
        return _row_wise(q, keys, values, window, scale)
    mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(diagonal=S - T)  # query i sees keys <= S-T+i
    if window is not None:
        mask = mask.triu(diagonal=S - T - window + 1)  # ... and > S-T+i - window
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),  # (1, H, T, D)
        keys.unsqueeze(0),  # (1, Hkv, S, D)
        values.unsqueeze(0),
        attn_mask=mask,
        enable_gqa=H != Hkv,
        scale=scale,
    )  # (1, H, T, D)
    return out.squeeze(0).transpose(0, 1).reshape(T, H * D)


def _row_wise(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, window: int | None,
              scale: float) -> torch.Tensor:
    T, H, D = q.shape
    Hkv, S, _ = keys.shape
    rows = []
    for i in range(T):
        n = S - T + i + 1  # keys this query may see: those before it and itself ...
        lo = max(0, n - window) if window is not None else 0  # ... back to the window's start
        qi = q[i].view(Hkv, H // Hkv, D)  # (Hkv, G, D): the heads that share each key head
        scores = torch.matmul(qi, keys[:, lo:n].transpose(1, 2)) * scale  # (Hkv, G, n - lo)
        rows.append(torch.matmul(torch.softmax(scores.float(), dim=-1).to(q.dtype), values[:, lo:n]))  # (Hkv, G, D)
    return torch.stack(rows).reshape(T, H * D)


def padded_rows(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor,
                scale: float | None = None) -> torch.Tensor:
    """q (R, H, D), a pass's rows padded to a fixed R; keys, values (Hkv, S, D) over every position; bias (R, S)
    fp32, 0 where a row may look and -inf elsewhere (past it, not yet written, or before its window) -> (R, H * D).
    All rows' scores come from one matmul and their outputs from another, on shapes that never change: a row's bits
    do not depend on how many of the R are real, and a GPU launches a handful of kernels per layer instead of a
    handful per row."""
    R, H, D = q.shape
    Hkv, S, _ = keys.shape
    G = H // Hkv
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    qg = q.view(R, Hkv, G, D).transpose(0, 1).reshape(Hkv, R * G, D)  # (Hkv, R G, D): a key head's query heads
    scores = torch.matmul(qg, keys.transpose(1, 2)).float().view(Hkv, R, G, S)  # (Hkv, R, G, S)
    scores = torch.add(bias.view(1, R, 1, S), scores, alpha=scale)  # scaled, the unseen at -inf
    probs = torch.softmax(scores, dim=-1).to(q.dtype).view(Hkv, R * G, S)
    out = torch.matmul(probs, values)  # (Hkv, R G, D)
    return out.view(Hkv, R, G, D).transpose(0, 1).reshape(R, H * D)
