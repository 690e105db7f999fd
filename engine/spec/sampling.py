"""Sampling as small pure functions: logits -> probabilities -> tokens.

The same transforms are applied to draft and target distributions (Leviathan §2.2), so the
rejection-sampling step compares like with like. Greedy (temperature 0) becomes a point mass at the
argmax, which makes the accept rule reduce to an exact-match test with no special case.
"""
from __future__ import annotations

import sys

import numpy as np
import torch

from engine.api.config import SamplingParams


def argmax(x: torch.Tensor) -> torch.Tensor:
    """The first maximum of each row of x (..., V) -> (...,), as x.argmax(-1). On the CPU through numpy: torch's
    took ~130 us for a 151,936-token row, numpy's ~12 (and a draft step or a verify row needs one or two)."""
    if x.device.type == "cpu" and x.dtype == torch.float32:
        return torch.from_numpy(np.asarray(x.numpy().argmax(-1)))
    return x.argmax(-1)


def logsumexp(x: torch.Tensor, at: torch.Tensor | None = None) -> torch.Tensor:
    """log(sum(exp(x))) over the last dim, (..., V) -> (..., 1), read off the softmax at each row's maximum: torch's
    softmax is vectorized, while its logsumexp took ~3x longer on rows holding -inf (a trimmed draft head).
    at (..., 1): where each row's maximum is, when the caller knows (a top_ids column): one pass over x fewer."""
    top = argmax(x).unsqueeze(-1) if at is None else at
    return x.gather(-1, top) - torch.log(torch.softmax(x, -1).gather(-1, top))


def top_ids(rows: torch.Tensor, k: int, width: int = 512) -> torch.Tensor:
    """The ids of each row's k largest values, largest first, as torch.topk(rows, k).indices (equal values may
    be ranked in another order). (N, V) -> (N, k)

    Each of a row's k largest values lies in one of the k blocks of `width` ids whose maxima are largest, so only
    those blocks (and the ids past the last whole block) are ranked: torch's topk over a 151,936-token row took
    ~0.2 ms, a step of the inspector needs one per verified row."""
    n, v = rows.shape
    blocks = v // width
    if blocks <= k or rows.stride(1) != 1:
        return torch.topk(rows, k, dim=-1).indices
    tiled = rows.as_strided((n, blocks, width), (rows.stride(0), width, 1))  # (N, B, W) a view
    best = torch.topk(tiled.amax(-1), k, dim=-1).indices  # (N, k) the blocks that hold the top k
    offsets = torch.arange(width, device=rows.device)
    ids = torch.cat([(best.unsqueeze(-1) * width + offsets).reshape(n, k * width),
                     torch.arange(blocks * width, v, device=rows.device).expand(n, -1)], dim=1)  # (N, k W + tail)
    return ids.gather(1, torch.topk(rows.gather(1, ids), k, dim=-1).indices)


def repetition_penalty(logits: torch.Tensor, context: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL-style penalty on tokens already in context: positive logits shrink, negative ones grow. (V,)"""
    if penalty == 1.0 or context.numel() == 0:
        return logits
    seen = logits.index_select(-1, context)
    seen = torch.where(seen > 0, seen / penalty, seen * penalty)
    return logits.index_copy(-1, context, seen)


def top_k_filter(logits: torch.Tensor, k: int) -> torch.Tensor:
    if k <= 0 or k >= logits.shape[-1]:
        return logits
    kth = torch.topk(logits, k, dim=-1).values[..., -1:]
    return logits.masked_fill(logits < kth, float("-inf"))


# Probability floors top_p_filter tries in turn before it sorts a whole row: sorting a 151,936-token row took ~13 ms
# (a draft step is ~8), finding and sorting the tokens above 1e-4 ~0.2 ms.
TOP_P_FLOORS = (1e-4, 1e-7, 0.0)


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p, then renormalise. (..., V)

    Once the tokens at or above a floor hold top_p of the mass, every token below it has at least that much ahead
    of it and is dropped: only those candidates need sorting."""
    if top_p >= 1.0:
        return probs
    rows = probs.reshape(-1, probs.shape[-1])
    out = torch.zeros_like(rows)
    for row, dst in zip(rows, out):
        for floor in TOP_P_FLOORS:
            idx = (row >= floor).nonzero().squeeze(1)  # (n,) candidates
            vals, order = torch.sort(row[idx], descending=True)
            ahead = vals.cumsum(0)
            if floor == 0.0 or (len(vals) and float(ahead[-1]) >= top_p):
                break
        kept = vals.masked_fill(ahead - vals >= top_p, 0.0)  # a token stays while the mass strictly ahead is below top_p
        dst[idx[order]] = kept / kept.sum()
    return out.reshape(probs.shape)


def probs_from_logits(logits: torch.Tensor, params: SamplingParams, context: torch.Tensor) -> torch.Tensor:
    """The distribution a token is drawn from, given the tokens before it. logits (V,) -> probs (V,)."""
    return _rows(repetition_penalty(logits.float(), context, params.repetition_penalty), params)


def greedy_token(logits: torch.Tensor, params: SamplingParams, context: torch.Tensor) -> int:
    """Where probs_from_logits puts its point mass under greedy, without building the row. logits (V,)"""
    return int(argmax(repetition_penalty(logits.float(), context, params.repetition_penalty)))


def probs_for_positions(
    logits: torch.Tensor, params: SamplingParams, context: torch.Tensor, drafted: torch.Tensor
) -> torch.Tensor:
    """Row i of logits (N, V) predicts the token after context + drafted[:i]. -> probs (N, V)."""
    if params.repetition_penalty == 1.0:  # context does not matter: transform all rows at once
        return _rows(logits, params)
    return torch.stack([probs_from_logits(logits[i], params, torch.cat([context, drafted[:i]])) for i in range(len(logits))])


def tempered_softmax(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """softmax(logits / T) on the last dim, finite for every T > 0. (..., V) float32 -> (..., V) float32

    Subtracting the maximum first is exact algebra (softmax is shift-invariant) and makes every scaled
    logit <= 0 with the maximum at exactly 0, so a tiny T sends the others to -inf (probability 0) instead
    of overflowing to inf - inf = NaN. A T below float32's smallest normal number (which would round to 0 or
    a denormal) is applied in float64, where every Python float is exact. As T -> 0 this tends to the
    uniform distribution over the tied maxima, which is exactly what it returns: no greedy cut-off.
    Below float64's smallest normal number even the closest float32 logits are > 1e262 apart once
    scaled, so the result is that limit, computed directly (no denormal divisor, whatever the FPU mode).
    """
    shifted = logits - logits.amax(-1, keepdim=True)
    if temperature < sys.float_info.min:
        ties = (shifted == 0).float()
        return ties / ties.sum(-1, keepdim=True)
    if temperature < torch.finfo(torch.float32).tiny:
        return torch.softmax(shifted.double() / temperature, dim=-1).float()
    return torch.softmax(shifted / temperature, dim=-1)


def _rows(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature (or argmax), top-k, softmax, top-p, on the last dim. (..., V) -> (..., V)"""
    logits = logits.float()
    if params.greedy:
        return torch.zeros_like(logits).scatter_(-1, argmax(logits).unsqueeze(-1), 1.0)
    # top-k keeps the same set before or after dividing by T > 0; before, no scaled value is yet -inf.
    logits = top_k_filter(logits, params.top_k)
    return top_p_filter(tempered_softmax(logits, params.temperature), params.top_p)


def point_mass(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """All mass on each token: q for a model-free drafter, or greedy drafting's. (K,) -> (K, V) float32"""
    return torch.zeros(len(tokens), vocab, device=tokens.device).scatter_(1, tokens[:, None], 1.0)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token from probs (V,) by inverting its CDF (float64) at one uniform draw. A point mass
    (greedy) returns its token and draws nothing. torch.multinomial does the same job but cost ~4.4 ms for a
    151,936-token vocabulary on the CPU: a tenth of a decode step, paid by every draft step too."""
    if int(torch.count_nonzero(probs)) == 1:  # a point mass (greedy): no float64 CDF over the vocabulary
        return int(argmax(probs))
    cdf = probs.double().cumsum(0)  # (V,); a zero-probability token adds no width, so it is never drawn
    u = torch.rand((), generator=generator, dtype=torch.float64, device=probs.device) * cdf[-1]
    return min(int(torch.searchsorted(cdf, u, right=True)), len(probs) - 1)


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): where a rejected draft token's replacement is drawn from. (V,)"""
    r = (p - q).clamp_min(0.0)
    total = r.sum()
    # p == q to rounding means rejection had ~zero chance; fall back to p rather than divide by ~0.
    return r / total if total > 1e-12 else p
