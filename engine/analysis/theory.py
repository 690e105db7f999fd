"""Leviathan et al.'s arithmetic, written once: what a round of K drafts is expected to commit, and the speedup over
plain decoding that follows from the acceptance rate and the costs. Used by the charts, the K tuner, adaptive K and
the benchmarks."""
from __future__ import annotations


def expected_tokens(alpha: float, k: float) -> float:
    """Tokens one round commits on average when each of its k drafts passes with probability alpha:
    (1 - a^(K+1)) / (1 - a), which is K + 1 at alpha = 1 (the limit of the fraction)."""
    alpha = min(max(alpha, 0.0), 1.0)
    return k + 1.0 if alpha >= 1.0 else (1.0 - alpha ** (k + 1.0)) / (1.0 - alpha)


def round_cost(k: float, c: float, w: float = 0.0) -> float:
    """A round's cost in target steps: one verify pass (1 + K w) and K draft steps (K c)."""
    return 1.0 + k * max(c, 0.0) + k * max(w, 0.0)


def theoretical_speedup(alpha: float, k: float, c: float, w: float = 0.0) -> float:
    """Leviathan's walltime improvement (1 - a^(K+1)) / ((1 - a)(1 + K c + K w)).

    alpha: acceptance rate; k: tokens drafted per round; c: one draft step's cost over one target step; w: what
    each extra row of the verify pass adds, in target steps (0 in the paper, which takes the pass as one step)."""
    if k <= 0:
        return 1.0
    return expected_tokens(alpha, k) / round_cost(k, c, w)
