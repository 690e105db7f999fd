"""Causal attention over the cached keys, batch-invariant where speculation needs it.

A verify pass scores K+1 positions at once where plain decoding scores them one at a time. For greedy
speculative output to equal plain greedy exactly (not merely up to near-ties), each position's attention must
produce the same bits either way. A fused kernel over T queries does not promise that: its blocking and its
masked softmax depend on T. So short passes (decode steps and verify passes) attend one query at a time,
each over exactly the keys it may see, with tensors of the same shapes whatever T is. Long passes (prompt
prefill, identical in both modes) use the fused kernel.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

ROW_WISE_MAX = 16  # up to this many queries (K + 1 <= 16) attend row by row


def causal_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """q (T, H, D) for the last T of S positions; keys, values (Hkv, S, D) -> (T, H * D)."""
    T, H, D = q.shape
    Hkv, S, _ = keys.shape
    if T <= ROW_WISE_MAX:
        return _row_wise(q, keys, values)
    mask = torch.ones(T, S, dtype=torch.bool, device=q.device).tril(diagonal=S - T)  # query i sees keys <= S-T+i
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1).unsqueeze(0),  # (1, H, T, D)
        keys.unsqueeze(0),  # (1, Hkv, S, D)
        values.unsqueeze(0),
        attn_mask=mask,
        enable_gqa=H != Hkv,
    )  # (1, H, T, D)
    return out.squeeze(0).transpose(0, 1).reshape(T, H * D)


def _row_wise(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    T, H, D = q.shape
    Hkv, S, _ = keys.shape
    scale = 1.0 / math.sqrt(D)
    rows = []
    for i in range(T):
        n = S - T + i + 1  # keys this query may see
        qi = q[i].view(Hkv, H // Hkv, D)  # (Hkv, G, D): the heads that share each key head
        scores = torch.matmul(qi, keys[:, :n].transpose(1, 2)) * scale  # (Hkv, G, n)
        rows.append(torch.matmul(torch.softmax(scores.float(), dim=-1).to(q.dtype), values[:, :n]))  # (Hkv, G, D)
    return torch.stack(rows).reshape(T, H * D)
