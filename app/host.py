"""The GUI's handle on the engine process (engine/service/process.py starts it; engine/api/protocol.py is what
they say to each other).

`EngineHost` starts the child with the "spawn" context (never fork a process that runs Qt), sends commands, and
turns the child's messages into Qt signals. A plain reader thread blocks on the pipe and posts every message to
the host through one queued signal, so every signal is emitted in the GUI thread and nothing touches a widget
from another thread; once the host forgets that process (shutdown, its death) or is deleted, its reader touches
nothing (app/thread_post.py). Each message goes through one table, `_handlers`: one of another type, or with fields that
do not match the protocol, is logged and dropped.

It is one of the two Hosts (app/host_protocol.py) the controller knows; an attached server's is the other.
`generate()` returns a RequestHandle (app/request_handle.py): that request's own signals. The host's signals
(GUI thread) are the process's:

    loadProgress(str, float)    stage text, fraction done in [0, 1] (-1: unknown)
    loaded(object)              EngineInfo of the engine now in use
    loadFailed(str)             a readable reason; the previous engine (if any) stays in use
    loadCancelled()             the user cancelled; the previous engine stays in use
    modelsListed(list)          engine.io.hub.LocalModel entries for the model picker
    statusReady(object)         EngineStatus, the answer to query_status(): RSS and free KV blocks
    died(str)                   the process ended unexpectedly: one sentence saying how. Requests that were
                                running get no further signal; the host is then stopped (start() or
                                reload() begins a new process)
"""
from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from itertools import count
from typing import Any

from PySide6.QtCore import QObject, Qt, Signal

from app.host_protocol import LoadRequest
from app.host_signals import REQUEST_MESSAGES, HostSignals
from app.request_handle import RequestHandle
from app.thread_post import ThreadPost
from engine.api.config import SamplingParams, SpecParams
from engine.api.protocol import (
    PROTOCOL_VERSION,
    Cancel,
    CancelLoad,
    CommandError,
    EngineInfo,
    EngineStatus,
    Fatal,
    Generate,
    Load,
    LoadCancelled,
    Loaded,
    LoadFailed,
    LoadProgress,
    ModelsListed,
    QueryStatus,
    Reset,
    Scan,
    Shutdown,
    Started,
    problem,
    version_problem,
)
from engine.service.loaders import DEFAULT_LISTER, DEFAULT_LOADER, Factory
from engine.service.process import spawn

log = logging.getLogger(__name__)


def death_sentence(exitcode: int | None, fatal: str | None) -> str:
    """One sentence for the window, from how the process ended."""
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        if -exitcode == getattr(signal, "SIGKILL", 9):
            # Known: the signal. Not known: who sent it (the OOM killer is one sender of several)
            return ("The engine process was killed (SIGKILL). The system sends it when memory runs out; "
                    "check free memory before reloading.")
        if name == "SIGSEGV":
            return "The engine process crashed (SIGSEGV: a fault in native code)."
        return f"The engine process was stopped by {name}."
    if fatal:
        return f"The engine process failed: {fatal}"
    if exitcode:
        return f"The engine process exited unexpectedly with status {exitcode}."
    return "The engine process exited unexpectedly."


class EngineHost(HostSignals):
    _message = Signal(object)  # reader thread -> GUI thread: (process, message)
    _lost = Signal(object)  # reader thread -> GUI thread: the process whose pipe closed

    def __init__(self, loader: Factory = DEFAULT_LOADER, lister: Factory = DEFAULT_LISTER,
                 parent: QObject | None = None, spawned: tuple[Any, Any] | None = None) -> None:
        """spawned: (process, connection) from `engine.service.process.spawn(loader, lister)`, started before Qt was
        imported; the first start() takes it over instead of starting another."""
        super().__init__(parent)
        self._loader, self._lister = loader, lister
        self._spawned = spawned
        self._ids = count(1)
        self._message.connect(self._dispatch, Qt.ConnectionType.QueuedConnection)
        self._lost.connect(self._on_lost, Qt.ConnectionType.QueuedConnection)
        self._emit_message, self._emit_lost = self._message.emit, self._lost.emit  # bound on the GUI thread
        self._alive = ThreadPost()  # shut as the host is deleted, whoever deletes it
        self.destroyed.connect(self._alive.close)
        self._mail = ThreadPost(self._alive)  # the current reader's way here: one per process, shut when forgotten
        self.loading: LoadRequest | None = None
        self.last_load: LoadRequest | None = None  # what reload() loads again
        self.info: EngineInfo | None = None
        self.pid: int | None = None
        self.process: Any = None
        self._conn: Any = None
        self._reader: threading.Thread | None = None
        self._fatal: str | None = None  # the loop's last words, for the death sentence
        self._handlers: dict[type, Callable[[Any], None]] = {
            Started: self._on_started,
            LoadProgress: lambda m: self.loadProgress.emit(m.stage, m.fraction),
            Loaded: self._on_loaded,
            LoadFailed: self._on_load_failed,
            LoadCancelled: self._on_load_cancelled,
            ModelsListed: lambda m: self.modelsListed.emit(m.models),
            EngineStatus: self.statusReady.emit,
            **{kind: self.deliver for kind in REQUEST_MESSAGES},
            Fatal: self._on_fatal,
            CommandError: lambda m: log.warning("the engine process refused a command: %s", m.problem),
        }

    # ---- process -------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Start the engine process (no model loaded yet). Returns at once; commands sent meanwhile wait."""
        if self.running:
            return
        proc, parent = self._spawned or spawn(self._loader, self._lister)
        self._spawned = None
        self.process, self._conn, self._mail = proc, parent, ThreadPost(self._alive)
        self._reader = threading.Thread(target=self._read, args=(proc, parent, self._mail),
                                        name="speclens-engine-reader",
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
        self.send(Shutdown())
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
        return self.load(last.target, last.draft, last.device, last.context)

    def _forget_process(self) -> None:
        self._mail.close()  # what its reader still reads reaches nobody
        if self._conn is not None:
            self._conn.close()
        self.process = self._conn = self._reader = None
        self.pid = self._fatal = None
        self.pending.clear()
        self.loading = None
        self.info = None

    def _read(self, proc: Any, conn: Any, mail: ThreadPost) -> None:
        """Reader thread: every message goes to the GUI thread as it is. It touches no Qt object but the signals,
        through `mail`, and never reaps the process: two threads waiting on one child can each miss its exit
        status."""
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                break
            except Exception as e:  # noqa: BLE001 - bytes that do not unpickle: the next message may
                log.warning("unreadable message from the engine process: %r", e)
                continue
            if not mail.post(self._emit_message, (proc, msg)):
                return  # the host forgot this process
        mail.post(self._emit_lost, proc)

    # ---- commands ------------------------------------------------------------------------------------------
    def send(self, command: object) -> bool:
        """Send a command; False when there is no process (its death is reported through `died`)."""
        if self._conn is None:
            return False
        try:
            self._conn.send(command)
            return True
        except (OSError, ValueError):  # the process is gone: the reader thread reports it
            return False

    @property
    def ready(self) -> bool:
        return self.info is not None

    def generate(self, messages: list[dict[str, str]], sampling: SamplingParams, spec: SpecParams,
                 stepping: bool = False, plain_every: int = 0) -> RequestHandle:
        """stepping: the engine pauses after each phase of a round (phase signal) until step() or resume().
        plain_every: a run of plain steps every that many rounds (engine.api.live.plain_step_due), 0 none."""
        handle = RequestHandle(next(self._ids), self.send)
        self.pending[handle.id] = handle
        self.send(Generate(handle.id, [dict(m) for m in messages], sampling, spec, stepping, plain_every))
        return handle

    def cancel(self, rid: int | None = None) -> None:
        """Cancel one request (None: all of them); it stops between two rounds, or two chunks of its prompt."""
        self.send(Cancel(rid))

    def cancel_all(self) -> None:
        if self.pending:
            self.cancel(None)

    def load(self, target: str | None = None, draft: str | None = None, device: str | None = None,
             context: int | None = None) -> LoadRequest:
        """Load in the engine process (target None: the embedded pair). The current engine stays until the new
        one is loaded."""
        req = LoadRequest(target, draft, device, context)
        self.loading = req
        self.send(Load(target, draft, device, context))
        return req

    def cancel_load(self) -> None:
        if self.loading is not None:
            self.send(CancelLoad())

    def reset(self) -> None:
        self.send(Reset())

    def scan_models(self) -> None:
        self.send(Scan())

    def query_status(self) -> None:
        """Ask for RSS and free KV blocks; answered through statusReady, even while a request runs."""
        self.send(QueryStatus())

    # ---- messages (GUI thread) -----------------------------------------------------------------------------
    def _dispatch(self, posted: tuple[Any, object]) -> None:
        proc, msg = posted
        if proc is not self.process:  # from an earlier process, already shut down or replaced
            return
        wrong = problem(msg, self._handlers)
        if wrong is not None:
            log.warning("ignored a message from the engine process: %s", wrong)
            return
        self._handlers[type(msg)](msg)

    def _on_started(self, m: Started) -> None:
        self.pid = m.pid
        wrong = version_problem(m.protocol)
        if wrong is not None:  # a build mixed from two versions: nothing it says can be read; the window says why
            log.error("the engine process speaks protocol version %s, this window %s", m.protocol,
                      PROTOCOL_VERSION)
            self._fatal = wrong  # the pipe closes next: _on_lost shows the sentence through `died`
            self.send(Shutdown())

    def _on_loaded(self, m: Loaded) -> None:
        self.info, self.last_load, self.loading = m.info, self.loading or self.last_load, None
        self.loaded.emit(m.info)

    def _on_load_failed(self, m: LoadFailed) -> None:
        self.loading = None
        self.loadFailed.emit(m.message)

    def _on_load_cancelled(self, _m: LoadCancelled) -> None:
        self.loading = None
        self.loadCancelled.emit()

    def _on_fatal(self, m: Fatal) -> None:
        self._fatal = m.message  # the pipe closes next: _on_lost words the death with it

    def _on_lost(self, proc: Any) -> None:
        """The pipe closed: the process has ended, or is about to."""
        if proc is not self.process:
            return
        proc.join(2)
        if proc.exitcode is None:  # closed its end yet still runs: it cannot be trusted any more
            proc.kill()
            proc.join(2)
        if self.loading is not None:  # it died loading: a reload tries that pair again
            self.last_load = self.loading
        fatal = self._fatal
        self._forget_process()
        self.died.emit(death_sentence(proc.exitcode, fatal))
