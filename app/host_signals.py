"""What every host has in common, declared once: the signals it gives the controller, and the routing of a
request's messages to that request's handle. The local engine process's host (app/host.py) and an attached
server's (app/remote_host.py) both receive the same typed messages (engine.api.protocol), so they are
interchangeable behind the Host interface (app/host_protocol.py)."""
from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from app.request_handle import RequestHandle
from engine.api.protocol import (
    Errored,
    Finished,
    PhaseReached,
    Prefilling,
    RequestSummary,
    Rounds,
)

RequestMessage = Prefilling | Rounds | PhaseReached | RequestSummary | Errored | Finished
REQUEST_MESSAGES: tuple[type, ...] = (Prefilling, Rounds, PhaseReached, RequestSummary, Errored, Finished)


class HostSignals(QObject):
    loadProgress = Signal(str, float)  # stage, fraction (< 0: unknown)
    loaded = Signal(object)  # EngineInfo
    loadFailed = Signal(str)  # one sentence
    loadCancelled = Signal()
    modelsListed = Signal(list)
    statusReady = Signal(object)  # EngineStatus
    died = Signal(str)  # why, in one sentence

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.pending: dict[int, RequestHandle] = {}  # the requests sent and not yet finished, by id

    @property
    def busy(self) -> bool:
        return bool(self.pending)

    def deliver(self, message: RequestMessage) -> None:
        """A request's message to its handle (GUI thread); Finished is the last, and forgets the request. One for
        an id that is not pending (never sent, or from a process already forgotten) is dropped."""
        handle = (self.pending.pop if isinstance(message, Finished) else self.pending.get)(message.rid, None)
        if handle is not None:
            handle.receive(message)
