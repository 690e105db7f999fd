"""One generate request in flight, as a QObject of its own (in the spirit of superqt's workers): the host routes
what the engine sends for this request to its signals, and what may be asked of a running request goes out
through its methods, so whoever sent it listens to it alone.

Signals (GUI thread), in order for one request:

    prefill(object)     PrefillProgress: how far a long prompt has been read (the target's, then the draft
                        model's catch-up), after each chunk
    rounds(list)        RoundEvents in order (batched: at most ~60 signals a second)
    phase(object)       PhaseEvent: a stepping request now waits for step() or resume()
    summary(object)     its Summary, once it ran to a stop or a cancel ... or
    errored(str)        a readable message (the request produced no Summary)
    finished()          always last, also for a request cancelled in the queue

If the engine process dies, the host says so through its own `died` signal and nothing more reaches the handle:
the owner of the request decides what it became (the controller calls abandon()).

The handle's connections keep their slots, and whatever those hold, alive as long as the handle: a listener that
holds the handle lets go of it on finished(), or the two keep each other alive through Qt, out of the garbage
collector's sight.
"""
from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject, Signal

from engine.api.config import SamplingParams, SpecParams
from engine.api.protocol import (
    Cancel,
    Continue,
    Errored,
    Finished,
    PhaseReached,
    Prefilling,
    RequestSummary,
    Rounds,
    SetStepping,
    Step,
    UpdateControls,
)

Send = Callable[[object], bool]


class RequestHandle(QObject):
    prefill = Signal(object)
    rounds = Signal(list)
    phase = Signal(object)
    summary = Signal(object)
    errored = Signal(str)
    finished = Signal()

    def __init__(self, rid: int, send: Send) -> None:
        super().__init__()
        self.id = rid
        self._send = send

    def cancel(self) -> None:
        """It stops between two rounds or two chunks of its prompt's prefill (or never starts, if it waits in the
        queue)."""
        self._send(Cancel(self.id))

    def update(self, sampling: SamplingParams, spec: SpecParams) -> None:
        """Live settings, read by the engine at the start of the request's next round."""
        self._send(UpdateControls(self.id, sampling, spec))

    def step(self) -> None:
        """Step-through: run to the next phase."""
        self._send(Step(self.id))

    def resume(self) -> None:
        """Step-through off for this request: it runs on without pausing."""
        self._send(Continue(self.id))

    def set_stepping(self, on: bool) -> None:
        self._send(SetStepping(self.id, on))

    def receive(self, message: Prefilling | Rounds | PhaseReached | RequestSummary | Errored | Finished) -> None:
        """What was sent for this request (by the engine process or, in the same typed messages, an attached
        server's stream), as the signal it stands for."""
        match message:
            case Prefilling(progress=progress):
                self.prefill.emit(progress)
            case Rounds(events=events):
                self.rounds.emit(events)
            case PhaseReached(event=event):
                self.phase.emit(event)
            case RequestSummary(summary=summary):
                self.summary.emit(summary)
            case Errored(message=text):
                self.errored.emit(text)
            case Finished():
                self.finished.emit()

    def abandon(self, reason: str) -> None:
        """End a request that its engine process can no longer answer for: errored(reason), then finished()."""
        self.errored.emit(reason)
        self.finished.emit()
