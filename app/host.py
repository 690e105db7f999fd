"""The GUI's handle on the engine process (engine/service.py documents the protocol it speaks).

`EngineHost` starts the child with the "spawn" context (never fork a process that runs Qt), sends commands, and
turns the child's messages into Qt signals. A plain reader thread blocks on the pipe and posts every message to
the host through one queued signal, so the public signals below are all emitted in the GUI thread and nothing
touches a widget from another thread.

Signals (GUI thread):

    loadProgress(str, float)    stage text, fraction done in [0, 1] (-1: unknown)
    loaded(object)              EngineInfo of the engine now in use
    loadFailed(str)             a readable reason; the previous engine (if any) stays in use
    loadCancelled()             the user cancelled; the previous engine stays in use
    modelsListed(list)          engine.io.hub.LocalModel entries for the model picker
    roundsReady(int, list)      request id, RoundEvents in order (batched: at most ~60 signals a second)
    phaseReady(int, object)     request id, PhaseEvent: a stepping request now waits for step() or resume()
    summaryReady(int, object)   request id, Summary (once per request that ran to a stop or a cancel)
    errored(int, str)           request id, readable message (the request produced no Summary)
    finished(int)               request id; always last for a request, after summaryReady or errored
    statusReady(dict)           the answer to status(): RSS and free KV blocks (see engine/service.py)
    died(str)                   the process ended unexpectedly: one sentence saying how. Requests that were
                                running get no further signal; the host is then stopped (start() or
                                reload() begins a new process)
"""
from __future__ import annotations

import signal
import threading
from dataclasses import dataclass, field
from itertools import count
from typing import Any

from PySide6.QtCore import QObject, Qt, Signal

from engine.api.config import SamplingParams, SpecParams
from engine.service.process import DEFAULT_LISTER, DEFAULT_LOADER, EngineInfo, Factory, spawn

_LOST = "__lost__"  # posted by the reader thread when the pipe closes: (_LOST, fatal message or None)


@dataclass
class Request:
    """A generate request in flight. `cancel()` and `update()` reach the engine between two rounds."""

    id: int
    host: EngineHost = field(repr=False)

    def cancel(self) -> None:
        self.host.cancel(self.id)

    def update(self, sampling: SamplingParams, spec: SpecParams) -> None:
        self.host.send("controls", self.id, sampling, spec)

    def step(self) -> None:
        """Step-through: run to the next phase."""
        self.host.send("step", self.id)

    def resume(self) -> None:
        """Step-through off for this request: it runs on without pausing."""
        self.host.send("continue", self.id)

    def set_stepping(self, on: bool) -> None:
        self.host.send("stepping", self.id, on)


@dataclass(frozen=True)
class LoadRequest:
    target: str | None  # None: the embedded default pair (provisioned on first use)
    draft: str | None
    device: str | None


def death_sentence(exitcode: int | None, fatal: str | None) -> str:
    """One sentence for the window, from how the process ended."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        if -exitcode == getattr(signal, "SIGKILL", 9):
            return "The engine process was killed (SIGKILL), most likely because the system ran out of memory."
        if name == "SIGSEGV":
            return "The engine process crashed (SIGSEGV: a fault in native code)."
        return f"The engine process was stopped by {name}."
    if fatal:
        return f"The engine process failed: {fatal}"
    if exitcode:
        return f"The engine process exited unexpectedly with status {exitcode}."
    return "The engine process exited unexpectedly."


class EngineHost(QObject):
    loadProgress = Signal(str, float)
    loaded = Signal(object)
    loadFailed = Signal(str)
    loadCancelled = Signal()
    modelsListed = Signal(list)
    roundsReady = Signal(int, list)
    phaseReady = Signal(int, object)
    summaryReady = Signal(int, object)
    errored = Signal(int, str)
    finished = Signal(int)
    statusReady = Signal(dict)
    died = Signal(str)
    _message = Signal(object)  # reader thread -> GUI thread

    def __init__(self, loader: Factory = DEFAULT_LOADER, lister: Factory = DEFAULT_LISTER,
                 parent: QObject | None = None, spawned: tuple[Any, Any] | None = None) -> None:
        """spawned: (process, connection) from `engine.service.process.spawn(loader, lister)`, started before Qt was
        imported; the first start() takes it over instead of starting another."""
        super().__init__(parent)
        self._loader, self._lister = loader, lister
        self._spawned = spawned
        self._ids = count(1)
        self._message.connect(self._dispatch, Qt.ConnectionType.QueuedConnection)
        self.pending: dict[int, Request] = {}
        self.loading: LoadRequest | None = None
        self.last_load: LoadRequest | None = None  # what reload() loads again
        self.info: EngineInfo | None = None
        self.pid: int | None = None
        self.process: Any = None
        self._conn: Any = None
        self._reader: threading.Thread | None = None

    # ---- process -------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the engine process (no model loaded yet). Returns at once; commands sent meanwhile wait."""
        if self.running:
            return
        proc, parent = self._spawned or spawn(self._loader, self._lister)
        self._spawned = None
        self.process, self._conn = proc, parent
        self._reader = threading.Thread(target=self._read, args=(proc, parent), name="speclens-engine-reader",
                                        daemon=True)
        self._reader.start()

    @property
    def running(self) -> bool:
        return self.process is not None

    def shutdown(self, wait_s: float = 5.0) -> bool:
        """Cancel everything and end the process; a process that does not stop in time (a load that cannot be
        interrupted) is killed. Returns whether it stopped by itself."""
        proc = self.process
        if proc is None:
            return True
        self.send("shutdown")
        proc.join(wait_s)
        clean = proc.exitcode is not None
        if not clean:
            proc.kill()
            proc.join(5)
        if self._reader is not None:
            self._reader.join(5)
        self._forget_process()
        return clean

    def reload(self) -> LoadRequest:
        """A new process loading the pair loaded last (the embedded pair when there was none)."""
        self.shutdown(1.0)
        self.start()
        last = self.last_load or LoadRequest(None, None, None)
        return self.load(last.target, last.draft, last.device)

    def _forget_process(self) -> None:
        if self._conn is not None:
            self._conn.close()
        self.process = self._conn = self._reader = None
        self.pid = None
        self.pending.clear()
        self.loading = None
        self.info = None

    def _read(self, proc: Any, conn: Any) -> None:
        """Reader thread: every message goes to the GUI thread as it is. It touches no Qt object but the signal,
        and never reaps the process: two threads waiting on one child can each miss its exit status."""
        fatal = None
        try:
            while True:
                try:
                    msg = conn.recv()
                except (EOFError, OSError):
                    break
                if msg[0] == "fatal":
                    fatal = msg[1]
                self._message.emit((proc, msg))
            self._message.emit((proc, (_LOST, fatal)))
        except RuntimeError:  # the host itself was deleted (its owner is gone): nobody is left to tell
            pass

    # ---- commands ------------------------------------------------------------------------------------------
    def send(self, *cmd: Any) -> bool:
        """Send a command; False when there is no process (its death is reported through `died`)."""
        if self._conn is None:
            return False
        try:
            self._conn.send(cmd)
            return True
        except (OSError, ValueError):  # the process is gone: the reader thread reports it
            return False

    @property
    def busy(self) -> bool:
        return bool(self.pending)

    @property
    def ready(self) -> bool:
        return self.info is not None

    def generate(self, messages: list[dict[str, str]], sampling: SamplingParams, spec: SpecParams,
                 stepping: bool = False) -> Request:
        """stepping: the engine pauses after each phase of a round (phaseReady) until step() or resume()."""
        req = Request(next(self._ids), self)
        self.pending[req.id] = req
        self.send("generate", req.id, list(messages), sampling, spec, stepping)
        return req

    def cancel(self, rid: int | None = None) -> None:
        """Cancel one request (None: all of them); it stops between two rounds."""
        self.send("cancel", rid)

    def cancel_all(self) -> None:
        if self.pending:
            self.cancel(None)

    def load(self, target: str | None = None, draft: str | None = None, device: str | None = None) -> LoadRequest:
        """Load in the engine process (target None: the embedded pair). The current engine stays until the new
        one is loaded."""
        req = LoadRequest(target, draft, device)
        self.loading = req
        self.send("load", target, draft, device)
        return req

    def cancel_load(self) -> None:
        if self.loading is not None:
            self.send("cancel_load")

    def reset(self) -> None:
        self.send("reset")

    def scan_models(self) -> None:
        self.send("scan")

    def query_status(self) -> None:
        """Ask for RSS and free KV blocks; answered through statusReady, even while a request runs."""
        self.send("status")

    # ---- messages (GUI thread) -----------------------------------------------------------------------------
    def _dispatch(self, posted: tuple) -> None:
        proc, msg = posted
        if proc is not self.process:  # from an earlier process, already shut down or replaced
            return
        kind = msg[0]
        if kind == "rounds":
            if msg[1] in self.pending:
                self.roundsReady.emit(msg[1], msg[2])
        elif kind == "summary":
            if msg[1] in self.pending:
                self.summaryReady.emit(msg[1], msg[2])
        elif kind == "phase":
            if msg[1] in self.pending:
                self.phaseReady.emit(msg[1], msg[2])
        elif kind == "errored":
            if msg[1] in self.pending:
                self.errored.emit(msg[1], msg[2])
        elif kind == "finished":
            if self.pending.pop(msg[1], None) is not None:
                self.finished.emit(msg[1])
        elif kind == "load_progress":
            self.loadProgress.emit(msg[1], msg[2])
        elif kind == "loaded":
            self.info, self.last_load, self.loading = msg[1], self.loading or self.last_load, None
            self.loaded.emit(msg[1])
        elif kind == "load_failed":
            self.loading = None
            self.loadFailed.emit(msg[1])
        elif kind == "load_cancelled":
            self.loading = None
            self.loadCancelled.emit()
        elif kind == "models":
            self.modelsListed.emit(msg[1])
        elif kind == "status":
            self.statusReady.emit(msg[1])
        elif kind == "started":
            self.pid = msg[1]
        elif kind == _LOST:  # the pipe closed: the process has ended, or is about to
            proc.join(2)
            if proc.exitcode is None:  # closed its end yet still runs: it cannot be trusted any more
                proc.kill()
                proc.join(2)
            if self.loading is not None:  # it died loading: a reload tries that pair again
                self.last_load = self.loading
            self._forget_process()
            self.died.emit(death_sentence(proc.exitcode, msg[1]))
