"""The engine process's state and its two threads: a reader that takes every command as it arrives, and the main
thread, which runs the jobs (load, scan, generate, reset) one at a time in the order sent. Commands that act at
once (cancel, live controls, step-through, status) reach a running request between two of its rounds.

Every command goes through one table, `handlers`: a message of any other type, or one whose fields are not what
engine.api.protocol says, is answered with CommandError, and the loop reads on.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
import traceback
from collections.abc import Callable
from functools import partial
from typing import Any

from engine.api.live import Controls, StepGate
from engine.api.protocol import (
    Cancel,
    CancelLoad,
    CommandError,
    Continue,
    EngineStatus,
    Finished,
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
    SetStepping,
    Shutdown,
    Started,
    Step,
    UpdateControls,
    problem,
)
from engine.service.describe import describe_error, info_of, log_failure
from engine.service.loaders import Factory
from engine.service.status import engine_status
from engine.service.streaming import stream

log = logging.getLogger(__name__)

PROGRESS_INTERVAL_S = 0.05  # at most ~20 progress messages a second

Job = Callable[[], None]


class Service:
    """The child's state: one engine, a job queue run by the main thread, a reader thread for commands."""

    def __init__(self, conn: Any, loader: Factory, lister: Factory) -> None:
        self.conn = conn
        self.warm_up = loader.warm_up
        self.loader = loader.resolve()
        self.lister = lister.resolve()
        self.engine: Any = None
        self.jobs: queue.Queue[Job | None] = queue.Queue()  # None: shut down
        self.requests: dict[int, Controls] = {}  # queued or running generate requests
        self.load_cancel: threading.Event | None = None
        self.reading = True
        self._send_lock = threading.Lock()
        self._unfinished = 0  # jobs queued or running: counted when queued, so no moment reads "idle" in between
        self._unfinished_lock = threading.Lock()
        self.handlers: dict[type, Callable[[Any], None]] = {  # run by the reader thread, as each arrives
            # jobs: queued for the main thread
            Load: self._queue_load,
            Scan: lambda _: self._queue(self.scan),
            Generate: self._queue_generate,
            Reset: lambda _: self._queue(self.reset),
            # at once
            UpdateControls: self._update_controls,
            Cancel: lambda c: self._cancel(c.rid),
            CancelLoad: lambda _: self._cancel_load(),
            QueryStatus: lambda _: self.send(self.status()),
            Step: lambda c: self._gate(c.rid, lambda gate: gate.step()),
            Continue: lambda c: self._gate(c.rid, lambda gate: gate.set_stepping(False)),
            SetStepping: lambda c: self._gate(c.rid, lambda gate: gate.set_stepping(c.on)),
            Shutdown: self._shutdown,
        }

    def send(self, message: object) -> None:
        with self._send_lock:  # both threads send: one message at a time on the pipe
            self.conn.send(message)

    def refuse(self, why: str) -> None:
        log.warning("refused a command: %s", why)
        self.send(CommandError(why))

    # ---- reader thread ---------------------------------------------------------------------------------------
    def read_commands(self) -> None:
        """Reads until Shutdown or the pipe closes. Nothing a command holds may end this thread: once it stops,
        QueryStatus, Cancel and Shutdown go unanswered and the window can only kill the process."""
        while self.reading:
            try:
                cmd = self.conn.recv()
            except (EOFError, OSError):  # the GUI went away: stop what runs and leave
                cmd = Shutdown()
            except Exception as e:  # noqa: BLE001 - bytes that do not unpickle: say so, and read on
                self._refuse_safely(f"unreadable message: {_cut(describe_error(e))}")
                continue
            try:
                wrong = problem(cmd, self.handlers)
                if wrong is not None:
                    self.refuse(wrong)
                    continue
                self.handlers[type(cmd)](cmd)
            except (EOFError, OSError):  # the pipe broke while answering: as if the GUI went away
                self._shutdown(Shutdown())
            except Exception as e:  # noqa: BLE001 - a command no check foresaw: refused, and the loop reads on
                log.warning("a command failed in the reader:\n%s", traceback.format_exc(limit=5))
                self._refuse_safely(f"{type(cmd).__name__} could not be handled: {_cut(describe_error(e))}")
            finally:
                del cmd  # a hostile value (deeply nested, huge) is freed here, not kept until the next arrives

    def _refuse_safely(self, why: str) -> None:
        try:
            self.refuse(why)
        except (EOFError, OSError):
            self._shutdown(Shutdown())

    def _queue(self, job: Job) -> None:
        with self._unfinished_lock:
            self._unfinished += 1
        self.jobs.put(job)

    def _queue_load(self, cmd: Load) -> None:
        self.load_cancel = threading.Event()
        self._queue(partial(self.load, cmd, self.load_cancel))

    def _queue_generate(self, cmd: Generate) -> None:
        if cmd.rid in self.requests:  # its events could not be told apart from the running one's
            self.refuse(f"Generate.rid {cmd.rid} is still running")
            return
        controls = Controls(cmd.sampling, cmd.spec)  # registered now, so a cancel that follows finds it queued
        controls.gate.set_stepping(cmd.stepping)
        controls.plain_every = cmd.plain_every
        self.requests[cmd.rid] = controls
        self._queue(partial(self.generate, cmd))

    def _update_controls(self, cmd: UpdateControls) -> None:
        def update(c: Controls) -> None:
            c.sampling, c.spec = cmd.sampling, cmd.spec

        self._request(cmd.rid, update)

    def _gate(self, rid: int, act: Callable[[StepGate], None]) -> None:
        self._request(rid, lambda c: act(c.gate))

    def _request(self, rid: int, act: Callable[[Controls], None]) -> None:
        """act on a queued or running request's controls; one that finished meanwhile has nothing to change."""
        c = self.requests.get(rid)
        if c is not None:
            act(c)

    def _cancel(self, rid: int | None) -> None:
        for key, c in list(self.requests.items()):
            if rid is None or key == rid:
                c.cancel()

    def _cancel_load(self) -> None:
        if self.load_cancel is not None:
            self.load_cancel.set()

    def _shutdown(self, _cmd: Shutdown) -> None:
        self._cancel(None)
        self._cancel_load()
        self.reading = False
        self.jobs.put(None)

    def status(self) -> EngineStatus:
        # `busy` first: this thread is the only one that queues jobs, so once it reads "idle" nothing can change
        # the engine until it has counted the blocks. Read last, a job finishing in between (a reset freeing
        # every block) gave "idle" beside the counts from before it.
        busy = self._unfinished > 0
        return engine_status(self.engine, busy)

    # ---- main thread -----------------------------------------------------------------------------------------
    def run(self) -> None:
        threading.Thread(target=self.read_commands, name="speclens-commands", daemon=True).start()
        self.send(Started(os.getpid()))
        try:
            self.warm_up()
        except Exception:  # noqa: BLE001 - the load itself reports what is wrong, as a message
            log.warning("warming up the engine failed:\n%s", traceback.format_exc())
        while (job := self.jobs.get()) is not None:
            try:
                job()
            finally:
                with self._unfinished_lock:
                    self._unfinished -= 1

    def load(self, cmd: Load, cancel: threading.Event) -> None:
        try:
            extra = {"context": cmd.context} if cmd.context is not None else {}  # older loaders take none
            engine = self.loader(cmd.target, cmd.draft, cmd.device, self._progress(), cancel.is_set, **extra)
        except Exception as e:  # noqa: BLE001 - every failure becomes a message, never a crash
            if cancel.is_set():
                self.send(LoadCancelled())
            else:
                log_failure(log, "model load failed", e)
                self.send(LoadFailed(describe_error(e)))
            return
        if cancel.is_set():  # a load itself cannot be interrupted: drop what it built
            del engine
            self.send(LoadCancelled())
            return
        self.engine = engine
        self.send(Loaded(info_of(engine)))

    def _progress(self) -> Callable[[str, float], None]:
        """A progress callback that sends at most every PROGRESS_INTERVAL_S, but always a new stage and the end."""
        last = [0.0, ""]

        def progress(stage: str, fraction: float) -> None:
            now = time.monotonic()
            if stage != last[1] or now - last[0] >= PROGRESS_INTERVAL_S or fraction >= 1.0:
                last[0], last[1] = now, stage
                self.send(LoadProgress(stage, float(fraction)))

        return progress

    def scan(self) -> None:
        try:
            models = list(self.lister())
        except Exception:  # noqa: BLE001 - an unreadable cache only empties the picker
            log.warning("listing local models failed:\n%s", traceback.format_exc())
            models = []
        self.send(ModelsListed(models))

    def reset(self) -> None:
        if self.engine is not None:
            self.engine.reset()

    def generate(self, cmd: Generate) -> None:
        try:
            stream(self.engine, cmd, self.requests[cmd.rid], self.send)
        finally:
            self.requests.pop(cmd.rid, None)
            self.send(Finished(cmd.rid))


def _cut(text: str, limit: int = 300) -> str:
    """An error's text, bounded: the reader answers with it and logs it."""
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"
