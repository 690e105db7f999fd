"""What the draft model's rounds made, position by position, so that a round at any ceiling is priced from rounds
drafted at any other.

Under the stop rule a round drafts until the ceiling or until the draft is unsure, and a draft at ceiling j is the
first j tokens of the draft at any higher ceiling (the rule reads only the tokens before). So two chains of
conditional chances describe every ceiling at once: that a round drafts position i once it drafted i - 1, and that
its first i drafts all pass once the first i - 1 did (a draft that stopped before i counts as not passing i). A round
says nothing about positions past its own ceiling; those keep what other rounds measured.
"""
from __future__ import annotations

from dataclasses import dataclass, field

POSITIONS = 16  # the K slider's top (AppDefaults.k_max)


def _zeros() -> list[float]:
    return [0.0] * (POSITIONS + 1)  # index i: draft position i (1-based); index 0 unused


@dataclass
class PositionTally:
    """Decayed counts per draft position: rounds that reached position i - 1 with i within their ceiling ("risk")
    and those that went on to i ("went"), for drafting and for passing."""

    drafted_risk: list[float] = field(default_factory=_zeros)
    drafted_went: list[float] = field(default_factory=_zeros)
    passed_risk: list[float] = field(default_factory=_zeros)
    passed_went: list[float] = field(default_factory=_zeros)

    def scale(self, f: float) -> None:
        for counts in (self.drafted_risk, self.drafted_went, self.passed_risk, self.passed_went):
            for i in range(len(counts)):
                counts[i] *= f

    def add(self, ceiling: int, drafted: int, accepted: int, decay: float = 1.0) -> None:
        """A round allowed `ceiling` drafts, drafted `drafted` and the target accepted the first `accepted`. The
        positions it could reach first weigh their past by `decay`; those past its ceiling keep theirs, since it
        measured nothing there (decayed by every round, a long run of low ceilings would forget the positions above
        them and never draft there again)."""
        top = min(ceiling, POSITIONS)
        for counts in (self.drafted_risk, self.drafted_went, self.passed_risk, self.passed_went):
            for i in range(1, top + 1):
                counts[i] *= decay
        for i in range(2, min(drafted + 1, top) + 1):  # position 1 is always drafted
            self.drafted_risk[i] += 1
            self.drafted_went[i] += i <= drafted
        for i in range(1, min(accepted + 1, top) + 1):
            self.passed_risk[i] += 1
            self.passed_went[i] += i <= accepted


def _rate(went: float, risk: float, prior: float, weight: float) -> float:
    return (went + weight * prior) / (risk + weight) if risk + weight > 0 else prior


@dataclass(frozen=True)
class Forecast:
    """A round at one ceiling: tokens it commits on average, and reach[d - 1], the chance it drafts at least d tokens
    (d = 1 .. the ceiling), from which its mean draft length and the chance of each length follow."""

    committed: float
    reach: tuple[float, ...]

    @property
    def drafted(self) -> float:
        return sum(self.reach)

    def length_chances(self) -> list[tuple[int, float]]:
        """(d, the chance the round drafts exactly d tokens), d = 1 .. the ceiling."""
        r = self.reach
        return [(d, r[d - 1] - (r[d] if d < len(r) else 0.0)) for d in range(1, len(r) + 1)]


def expected_round(now: PositionTally, long: PositionTally, ceiling: int, prior_goes_on: float, prior_passes: float,
                   weight: float) -> Forecast:
    """A round at `ceiling`: each position's chance from this request's counts shrunk towards the long run's
    (`weight` pseudo-rounds), the long run's towards the priors."""
    committed, reach, passes = 1.0, 1.0, 1.0
    reaches = []
    for i in range(1, min(ceiling, POSITIONS) + 1):
        if i > 1:
            base = _rate(long.drafted_went[i], long.drafted_risk[i], prior_goes_on, weight)
            reach *= _rate(now.drafted_went[i], now.drafted_risk[i], base, weight)
        base = _rate(long.passed_went[i], long.passed_risk[i], prior_passes, weight)
        passes *= _rate(now.passed_went[i], now.passed_risk[i], base, weight)
        reaches.append(reach)
        committed += passes
    return Forecast(committed, tuple(reaches))
