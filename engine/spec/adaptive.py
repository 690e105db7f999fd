"""Adaptive K: pick the K that maximises expected tokens per unit time from recent rounds.

Per-token acceptance α is estimated as accepted / trials, where a round that stopped at a rejection
made n + 1 trials and one that passed all K made K; both counts decay so the estimate follows the text.
The cost model is Leviathan's, with the verify pass charged for its width: a round of K drafts costs
1 + K·c + K·w target steps, where c is a draft step and w what each extra verify row adds (in steps). With
the batched quantized kernels w is small but not zero, and it is measured here from the rounds themselves:
verify times at two or more K give a line whose slope over its intercept is w.
"""
from __future__ import annotations

from engine.analysis.theory import theoretical_speedup
from engine.api.config import SpecParams


class AdaptiveK:
    def __init__(self, decay: float = 0.8, alpha: float = 0.6, c: float = 0.3, w: float = 0.0) -> None:
        self.decay = decay
        self.hits, self.trials = alpha * 4, 4.0  # a weak prior worth ~4 trials
        self.c, self.w = c, w
        self.verify_s: dict[int, float] = {}  # K -> recent verify seconds

    @property
    def alpha(self) -> float:
        return min(self.hits / self.trials, 0.999)

    def observe(self, drafted: int, accepted: int, draft_s_per_token: float, verify_s: float) -> None:
        self.hits = self.hits * self.decay + accepted
        self.trials = self.trials * self.decay + accepted + (1 if accepted < drafted else 0)
        if verify_s <= 0:
            return
        old = self.verify_s.get(drafted)
        self.verify_s[drafted] = verify_s if old is None else 0.7 * old + 0.3 * verify_s
        step = self._fit_step()
        self.c = 0.7 * self.c + 0.3 * (draft_s_per_token / (step or verify_s))

    def _fit_step(self) -> float | None:
        """Least-squares line verify_s = step·(1 + w·K) over the K seen; updates w, returns the step time."""
        if len(self.verify_s) < 2:
            return None
        ks, vs = list(self.verify_s), list(self.verify_s.values())
        mk, mv = sum(ks) / len(ks), sum(vs) / len(vs)
        slope = sum((k - mk) * (v - mv) for k, v in zip(ks, vs)) / sum((k - mk) ** 2 for k in ks)
        step = mv - slope * mk
        if step <= 0:
            return None
        self.w = max(0.0, slope / step)
        return step

    def choose(self, spec: SpecParams) -> int:
        """The best K in 1..spec.k: the K the user set is the ceiling (k_max only bounds what may be set)."""
        return max(range(1, spec.k + 1), key=lambda k: theoretical_speedup(self.alpha, k, self.c, self.w))
