"""Sampling as small pure functions: logits -> probabilities -> tokens.

The same transforms are applied to draft and target distributions (Leviathan §2.2), so the
rejection-sampling step compares like with like. Greedy (temperature 0) becomes a point mass at the
argmax, which makes the accept rule reduce to an exact-match test with no special case.
"""
from __future__ import annotations

import torch

from .config import SamplingParams


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


def top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Keep the smallest set of most likely tokens whose mass reaches top_p, then renormalise."""
    if top_p >= 1.0:
        return probs
    sorted_p, order = torch.sort(probs, dim=-1, descending=True)
    before = sorted_p.cumsum(-1) - sorted_p  # mass strictly ahead of each token
    sorted_p = sorted_p.masked_fill(before >= top_p, 0.0)
    kept = torch.zeros_like(probs).scatter(-1, order, sorted_p)
    return kept / kept.sum(-1, keepdim=True)


def probs_from_logits(logits: torch.Tensor, params: SamplingParams, context: torch.Tensor) -> torch.Tensor:
    """The distribution a token is drawn from, given the tokens before it. logits (V,) -> probs (V,)."""
    return _rows(repetition_penalty(logits.float(), context, params.repetition_penalty), params)


def probs_for_positions(
    logits: torch.Tensor, params: SamplingParams, context: torch.Tensor, drafted: torch.Tensor
) -> torch.Tensor:
    """Row i of logits (N, V) predicts the token after context + drafted[:i]. -> probs (N, V)."""
    if params.repetition_penalty == 1.0:  # context does not matter: transform all rows at once
        return _rows(logits, params)
    return torch.stack([probs_from_logits(logits[i], params, torch.cat([context, drafted[:i]])) for i in range(len(logits))])


def _rows(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Temperature (or argmax), top-k, softmax, top-p, on the last dim. (..., V) -> (..., V)"""
    logits = logits.float()
    if params.greedy:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)
    logits = top_k_filter(logits / params.temperature, params.top_k)
    return top_p_filter(torch.softmax(logits, dim=-1), params.top_p)


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """Draw one token from probs (V,). A point mass (greedy) needs no random number."""
    return int(torch.multinomial(probs, 1, generator=generator).item())


def residual(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(0, p - q)): where a rejected draft token's replacement is drawn from. (V,)"""
    r = (p - q).clamp_min(0.0)
    total = r.sum()
    # p == q to rounding means rejection had ~zero chance; fall back to p rather than divide by ~0.
    return r / total if total > 1e-12 else p
