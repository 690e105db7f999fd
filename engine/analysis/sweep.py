"""The K tuner's arithmetic: one replay of a prompt per (drafter, K), each one's speedup over plain decoding, and
Leviathan's curve from the α and c the replays measured. Pure Python: the GUI imports it (app/tuner.py).

Rates are decode rates, the chat's own (Summary.tokens_per_s): new tokens over the request's time less the prompt
prefill and the draft model's reading of the prompt, so a replay that paid a prefill and one that reused a cache
compare fairly.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine.api.events import RoundEvent, Summary
from engine.analysis.theory import theoretical_speedup

KS: tuple[int, ...] = tuple(range(1, 9))
DRAFTERS = ("model", "ngram")
SWEEP_COLUMNS: tuple[str, ...] = (
    "sweep", "message", "run", "drafter", "k", "new_tokens", "rounds", "drafted", "accepted", "acceptance_rate",
    "tokens_per_s", "speedup", "leviathan_speedup", "alpha", "c", "best", "stop_reason",
)


def plan(has_draft_model: bool, ks: Sequence[int] = KS) -> list[tuple[str | None, int]]:
    """The replays, in order: plain first (the reference), then the draft model at each K, then the n-gram
    drafter at each K. (None, 0) is plain decoding."""
    if not ks or min(ks) < 1:
        raise ValueError(f"the tuner needs K values >= 1, got {list(ks)}")
    drafters = DRAFTERS if has_draft_model else ("ngram",)
    return [(None, 0)] + [(d, k) for d in drafters for k in ks]


@dataclass(frozen=True)
class SweepRun:
    """One replay's totals."""

    drafter: str | None  # "model", "ngram", or None for plain decoding
    k: int  # 0 for plain decoding
    new_tokens: int
    rounds: int
    drafted: int
    accepted: int
    trials: int  # accept/reject tests decided: every accepted draft, plus one per round that hit a rejection
    decode_s: float  # total time less the prompt prefill and the draft model's reading of the prompt
    draft_ms: float
    verify_ms: float
    stop_reason: str
    token_ids: tuple[int, ...] = ()
    message: int = 0  # its reply number in the session stats (the CSV's `message`)

    def __post_init__(self) -> None:
        if self.drafter not in (None, *DRAFTERS):
            raise ValueError(f"drafter must be None, 'model' or 'ngram', got {self.drafter!r}")
        if (self.drafter is None) != (self.k == 0) or self.k < 0:
            raise ValueError(f"K must be 0 exactly for plain decoding, got drafter {self.drafter!r}, K {self.k}")
        counts = (self.new_tokens, self.rounds, self.drafted, self.accepted, self.trials)
        if min(counts) < 0 or self.accepted > self.drafted or self.accepted > self.trials:
            raise ValueError(f"inconsistent counts in {self}")

    @property
    def label(self) -> str:
        return "plain" if self.drafter is None else f"{'draft model' if self.drafter == 'model' else 'n-gram'} K={self.k}"

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.decode_s if self.decode_s > 0 else 0.0


def run_of(drafter: str | None, k: int, summary: Summary, rounds: Sequence[RoundEvent], message: int = 0) -> SweepRun:
    """A replay's SweepRun from its Summary and RoundEvents."""
    trials = sum(ev.accepted + (ev.accepted < len(ev.drafted)) for ev in rounds)
    # Summary's own decode time (less the prompt prefill and the draft model's first catch-up, its reading of the
    # prompt; later catch-ups are paid while decoding and count), so the tuner's rates are the chat's
    decode_s = summary.new_tokens / summary.tokens_per_s if summary.tokens_per_s > 0 else 0.0
    return SweepRun(drafter, k, summary.new_tokens, summary.rounds, summary.drafted, summary.accepted, trials,
                    decode_s, summary.draft_ms, summary.verify_ms, summary.stop_reason, summary.token_ids, message)


@dataclass(frozen=True)
class Sweep:
    """Every replay of one tuning, plain first."""

    runs: tuple[SweepRun, ...]

    def __post_init__(self) -> None:
        if sum(r.drafter is None for r in self.runs) > 1:
            raise ValueError("a sweep has at most one plain run")

    @property
    def plain(self) -> SweepRun | None:
        return next((r for r in self.runs if r.drafter is None), None)

    def series(self, drafter: str) -> list[SweepRun]:
        return sorted((r for r in self.runs if r.drafter == drafter), key=lambda r: r.k)

    def speedup(self, run: SweepRun) -> float | None:
        """Its decode rate over plain decoding's; None without a plain rate."""
        base = self.plain.tokens_per_s if self.plain is not None else 0.0
        return run.tokens_per_s / base if base > 0 else None

    @property
    def alpha(self) -> float | None:
        """Per-token acceptance over the draft model's replays: accepted / decided tests (the geometric MLE)."""
        runs = self.series("model")
        trials = sum(r.trials for r in runs)
        return sum(r.accepted for r in runs) / trials if trials else None

    @property
    def c(self) -> float | None:
        """One draft step over one target step: draft ms per drafted token over plain verify ms per token."""
        runs, plain = self.series("model"), self.plain
        drafted = sum(r.drafted for r in runs)
        if not drafted or plain is None or not plain.new_tokens or plain.verify_ms <= 0:
            return None
        return sum(r.draft_ms for r in runs) / drafted / (plain.verify_ms / plain.new_tokens)

    def leviathan(self, k: int) -> float | None:
        """(1 − α^(K+1)) / ((1 − α)(1 + K·c)) at the measured α and c."""
        alpha, c = self.alpha, self.c
        return None if alpha is None or c is None else theoretical_speedup(alpha, k, c)

    @property
    def noise(self) -> float | None:
        """How far from 1× the replays that accepted no draft landed (their tokens are all plain target steps, so
        their spread is timing noise plus drafting overhead); None when every speculative replay accepted some."""
        spreads = [abs(s - 1.0) for r in self.runs
                   if r.drafter is not None and r.accepted == 0 and (s := self.speedup(r)) is not None]
        return max(spreads) if spreads else None

    @property
    def best(self) -> SweepRun | None:
        """The fastest speculative replay (None before any has a speedup)."""
        scored = [(s, r) for r in self.runs if r.drafter is not None and (s := self.speedup(r)) is not None]
        return max(scored, key=lambda sr: sr[0])[1] if scored else None

    def rows(self, sweep: int = 1) -> list[dict[str, object]]:
        """One CSV row per replay (SWEEP_COLUMNS)."""
        best = self.best
        alpha, c = self.alpha, self.c
        out = []
        for i, r in enumerate(self.runs, 1):
            speedup = self.speedup(r)
            theory = self.leviathan(r.k) if r.drafter == "model" else None
            out.append({
                "sweep": sweep, "message": r.message or "", "run": i, "drafter": r.drafter or "plain", "k": r.k,
                "new_tokens": r.new_tokens, "rounds": r.rounds, "drafted": r.drafted, "accepted": r.accepted,
                "acceptance_rate": round(r.accepted / r.drafted, 4) if r.drafted else "",
                "tokens_per_s": round(r.tokens_per_s, 3), "speedup": "" if speedup is None else round(speedup, 4),
                "leviathan_speedup": "" if theory is None else round(theory, 4),
                "alpha": "" if alpha is None else round(alpha, 4), "c": "" if c is None else round(c, 4),
                "best": int(r is best), "stop_reason": r.stop_reason,
            })
        return out
