"""Adaptive K: pick the K that maximises expected tokens per unit time from recent rounds.

Per-token acceptance α is estimated as accepted / trials, where a round that stopped at a rejection
made n + 1 trials and one that passed all K made K; both counts decay so the estimate follows the text.
The cost model is Leviathan's: a round of K drafts costs K·c + 1 target steps.
"""
from __future__ import annotations

from .config import SpecParams


def expected_speedup(alpha: float, k: int, c: float) -> float:
    """(1 − α^(K+1)) / ((1 − α)(1 + K·c)): tokens per round over the round's cost in target steps."""
    tokens = k + 1 if alpha >= 1.0 else (1 - alpha ** (k + 1)) / (1 - alpha)
    return tokens / (1 + k * c)


class AdaptiveK:
    def __init__(self, decay: float = 0.8, alpha: float = 0.6, c: float = 0.3) -> None:
        self.decay = decay
        self.hits, self.trials = alpha * 4, 4.0  # a weak prior worth ~4 trials
        self.c = c

    @property
    def alpha(self) -> float:
        return min(self.hits / self.trials, 0.999)

    def observe(self, drafted: int, accepted: int, draft_s_per_token: float, verify_s: float) -> None:
        self.hits = self.hits * self.decay + accepted
        self.trials = self.trials * self.decay + accepted + (1 if accepted < drafted else 0)
        if verify_s > 0:
            self.c = 0.7 * self.c + 0.3 * (draft_s_per_token / verify_s)

    def choose(self, spec: SpecParams) -> int:
        """The best K in 1..spec.k: the K the user set is the ceiling (k_max only bounds what may be set)."""
        return max(range(1, spec.k + 1), key=lambda k: expected_speedup(self.alpha, k, self.c))
