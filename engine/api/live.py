"""What may change while a request runs, read by the engine at the start of every round. No torch here, so the
engine process's command reader (engine/service/) can hold one without importing the engine."""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from engine.api.config import SamplingParams, SpecParams


class StepGate:
    """Step-through: while stepping is on, the engine waits here after each phase of a round.

    `step()` lets it run to the next phase (presses made before it arrives are kept and used in turn);
    `set_stepping(False)` ('continue') lets it run on; `release()` (a cancel) opens the gate for good.
    Thread-safe: the engine waits on one thread, the command reader drives it from another.
    """

    def __init__(self, stepping: bool = False) -> None:
        self._cond = threading.Condition()
        self._stepping = stepping
        self._permits = 0
        self._released = False

    @property
    def stepping(self) -> bool:
        return self._stepping and not self._released

    def set_stepping(self, on: bool) -> None:
        with self._cond:
            self._stepping, self._permits = bool(on), 0
            self._cond.notify_all()

    def step(self) -> None:
        with self._cond:
            self._permits += 1
            self._cond.notify_all()

    def release(self) -> None:
        with self._cond:
            self._released = True
            self._cond.notify_all()

    def wait(self, timeout: float | None = None) -> bool:
        """Block until a step, a continue or a release; True unless `timeout` ran out first."""
        with self._cond:
            ok = self._cond.wait_for(lambda: not self.stepping or self._permits > 0, timeout)
            if ok and self.stepping:
                self._permits -= 1
            return ok


PLAIN_FIRST = 5  # a reply's first plain step: after its first rounds (the first one carries the draft's prefill)
# Plain steps come as a run of this many in a row. Under a busy core the first plain step after speculative rounds
# ran faster than continuous plain decoding (docs/app.md: in the window 93-134 ms a token against Run > Compare's
# 161-176 ms), so the window's basis times only the steps that follow a plain step (app/views/chart_data.py).
PLAIN_RUN = 3


def plain_step_due(round_no: int, every: int) -> bool:
    """With `every` > 0, a run of PLAIN_RUN plain steps from round PLAIN_FIRST and again every `every` rounds after
    it (fewer when `every` leaves no speculative round between runs), and speculation as set goes on after each run.
    Fixed by round number, never asked for when the window gets round to it: each choice changes how many random
    numbers a round draws, so a sampled reply is the same from the same seed only if its plain steps fall on the same
    rounds however fast the window reads (step-through and its twin rely on it)."""
    return every > 0 and round_no >= PLAIN_FIRST and (round_no - PLAIN_FIRST) % every < min(PLAIN_RUN, every - 1)


class Controls:
    """Values another thread may change while a request runs; read at the start of every round.

    Each attribute is replaced whole (never mutated in place), so a round sees a consistent value.
    """

    def __init__(self, sampling: SamplingParams, spec: SpecParams) -> None:
        self.sampling = sampling
        self.spec = spec
        self.cancelled = False
        # The window's measured speedup times plain steps beside the speculative rounds: see plain_step_due.
        self.plain_every = 0
        self.gate = StepGate()  # step-through: see StepGate
        self.on_phase: Callable[[Any], None] | None = None  # receives each engine.api.events.PhaseEvent while stepping
        self.on_prefill: Callable[[Any], None] | None = None  # each engine.api.events.PrefillProgress of a long prompt

    def cancel(self) -> None:
        self.cancelled = True
        self.gate.release()  # a paused request wakes up, finishes its round and stops
