"""The charts' data, plain Python and numpy (no Qt): the per-round series (`ChartBuffer`), the GUI-thread time
budget the panel spends from (`TimeBudget`), and the small numeric helpers its plots use. See app/views/charts.py for
how the panel reads them."""
from __future__ import annotations

import math
import time

import numpy as np

from engine.analysis.stats import SpeedTotals, round_tokens_per_s
from engine.api.events import RoundEvent

ROLLING_WINDOW = 8
NAN = float("nan")


def nice_ceiling(v: float) -> float:
    """The smallest 1, 2, 2.5 or 5 times a power of ten that is >= v: axis limits that change rarely."""
    if not v > 0 or math.isinf(v):
        return 1.0
    mag = 10.0 ** math.floor(math.log10(v))
    return next(m * mag for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * mag >= v * (1 - 1e-12))


def rolling_mean(values: np.ndarray, window: int = ROLLING_WINDOW) -> np.ndarray:
    """Trailing mean over up to `window` values (fewer at the start)."""
    if len(values) == 0:
        return values
    c = np.cumsum(np.insert(values.astype(float), 0, 0.0))
    n = np.arange(1, len(values) + 1)
    lo = np.maximum(n - window, 0)
    return (c[n] - c[lo]) / (n - lo)


def last_value(values: list[float]) -> float | None:
    for v in reversed(values):
        if not math.isnan(v):
            return v
    return None


class ChartBuffer:
    """Per-round series for the current conversation.

    The speedup is each reply's own: its speculative rounds' rate over its plain steps' rate, both in wall time
    (SpeedTotals.measured_speedup), never over a rate from other minutes. Until a reply has timed a plain step its
    measured speedup is NaN: no estimate stands in for it. plain_ms (the tokens chart's dashed line and the theory's
    c) is the mean one-row target pass, compute time like the per-round tokens/s it is drawn beside."""

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        self.x: list[int] = []
        self.acceptance: list[float] = []  # NaN for rounds that drafted nothing
        self.tokens_per_s: list[float] = []
        self.k: list[float] = []  # NaN in plain mode
        self.drafted: list[float] = []  # tokens actually drafted: fewer than K when the draft stopped early
        self.speedup: list[float] = []  # the reply's measured speedup after each round; NaN without a basis
        self.theoretical: list[float] = []  # the reply's theory after each round
        self.plain_step: list[float] = []  # the reply's mean one-row pass ms after each round; NaN before one
        self.accepted_len: list[int] = []  # histogram counts, index = accepted drafts in a round
        self.pos_drafted: list[int] = []
        self.pos_accepted: list[int] = []
        self.message_starts: list[int] = []
        self.totals = SpeedTotals()  # the whole conversation's rounds ("this chat")
        self.reply = SpeedTotals()  # the current reply's rounds ("this reply")
        self.version = 0

    def start_message(self) -> None:
        self.message_starts.append(len(self.x) + 1)
        self.reply = SpeedTotals()
        self.version += 1

    @property
    def plain_ms(self) -> float | None:
        """This reply's plain step: the mean of its one-row target passes, None before one."""
        return self.reply.step_ms_per_pass

    def theory_now(self) -> float | None:
        """Leviathan's speedup for this reply's rounds so far."""
        return self.reply.theoretical_speedup()

    def feed(self, ev: RoundEvent) -> None:
        self.x.append(len(self.x) + 1)
        self.totals.add(ev)
        self.reply.add(ev)
        drafted = len(ev.drafted)
        self.acceptance.append(ev.accepted / drafted if drafted else NAN)
        self.tokens_per_s.append(round_tokens_per_s(ev))
        self.k.append(float(ev.k) if ev.mode == "speculative" else NAN)
        self.drafted.append(float(drafted) if ev.mode == "speculative" else NAN)
        if drafted:
            while len(self.accepted_len) <= max(ev.accepted, ev.k):
                self.accepted_len.append(0)
            self.accepted_len[ev.accepted] += 1
            while len(self.pos_drafted) < drafted:
                self.pos_drafted.append(0)
                self.pos_accepted.append(0)
            for i, d in enumerate(ev.drafted):
                self.pos_drafted[i] += 1
                self.pos_accepted[i] += d.accepted
        r = self.reply
        measured, theory, step = r.measured_speedup(), r.theoretical_speedup(), r.step_ms_per_pass
        self.speedup.append(NAN if measured is None else measured)
        self.theoretical.append(NAN if theory is None else theory)
        self.plain_step.append(NAN if step is None else step)
        self.version += 1

    def measured(self) -> np.ndarray:
        """Each reply's speculative over plain tokens/s after each of its rounds (NaN where it has no basis)."""
        return np.asarray(self.speedup, dtype=float)

    def position_rates(self) -> list[float]:
        return [a / d if d else 0.0 for a, d in zip(self.pos_accepted, self.pos_drafted)]


class TimeBudget:
    """A token bucket of GUI-thread seconds that refills at `share` of wall-clock time, up to `burst`.

    On a machine with few cores, chart work takes its time from the engine process's threads, and slows
    generation by about its share of wall time (app/views/charts.py). Spending from this bucket keeps that share
    bounded however fast rounds arrive."""

    def __init__(self, share: float, burst: float) -> None:
        self.share, self.burst = share, burst
        self.level = burst
        self._t = time.perf_counter()

    def _refill(self) -> None:
        now = time.perf_counter()
        self.level = min(self.burst, self.level + (now - self._t) * self.share)
        self._t = now

    def allow(self) -> bool:
        self._refill()
        return self.level > 0

    def spend(self, seconds: float) -> None:
        self._refill()
        self.level -= seconds
