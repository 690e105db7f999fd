"""The engine's own process: a command loop over a multiprocessing Pipe. No Qt here, and no torch at import.

The GUI (app/host.py) starts `serve` in a child made with the "spawn" context, so the GUI's interpreter never
hosts torch, and a crash, a segfault in native code or an OOM kill here cannot take the window down.

Protocol: every message is a tuple whose first item names it; the payloads are plain values and the
dataclasses of engine.api.config / engine.api.events (they pickle as they are).

Commands (GUI -> engine). Load, scan, generate and reset run one at a time in the order sent; the others act
at once, so they reach a running request between two of its rounds.

    ("load", target, draft, device)      target None: the embedded default pair
    ("cancel_load",)                     the running load stops at its next progress check
    ("scan",)                            list the local models for the picker
    ("generate", rid, messages, sampling, spec[, stepping])   stepping True: pause after each phase (below)
    ("controls", rid, sampling, spec)    live settings, read by the engine at the start of its next round
    ("cancel", rid)                      rid None: every request, running or queued
    ("reset",)                           forget the cached conversation
    ("status",)                          answered at once with ("status", dict), even mid-request
    ("step", rid)                        step-through: the paused request runs to its next phase
    ("continue", rid)                    step-through off for this request: it runs on without pausing
    ("stepping", rid, on)                step-through on or off mid-request (on: it pauses at its next phase)
    ("shutdown",)                        cancel everything, then exit

Events (engine -> GUI):

    ("started", pid)                               first, once the loop runs
    ("load_progress", stage, fraction)             zero or more (at most ~20/s), then exactly one of:
    ("loaded", EngineInfo) | ("load_failed", message) | ("load_cancelled",)
    ("models", [engine.io.hub.LocalModel])            answers "scan"
    ("rounds", rid, [RoundEvent])                  in order; batched to at most ~60 messages/s
    ("phase", rid, PhaseEvent)                     step-through only: the request now waits for a command;
                                                   every round before it was sent first
    ("summary", rid, Summary)                      once per request that reached a stop or a cancel ...
    ("errored", rid, message)                      ... or once per request that failed
    ("finished", rid)                              always, last for every request (also one cancelled in
                                                   the queue, which sends nothing else)
    ("status", {"pid", "rss_bytes", "target_free_blocks", "target_total_blocks",
                "draft_free_blocks", "draft_total_blocks",    blocks None where the engine has none
                "busy"})                                       a job runs or waits (load, generate, reset, scan)
    ("fatal", message)                             the loop itself failed; the process exits with status 1

Before its first job the child runs the loader's warm-up (`Factory.warm`: for the real engine, importing torch
and loading the kernels), so a child started early does that while the GUI is still starting.

The engine factory and the model lister are given as import paths ("package.module:function") plus picklable
keyword arguments (`Factory`), so tests can run a scripted engine or tiny models here.
"""
from __future__ import annotations

import importlib
import logging
import multiprocessing
import os
import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.api.live import Controls
from engine.api.events import Summary

log = logging.getLogger(__name__)

Progress = Callable[[str, float], None]

PROGRESS_INTERVAL_S = 0.05  # at most ~20 progress messages a second
BATCH_S = 0.016  # at most ~60 round messages a second: each one wakes the GUI thread


@dataclass(frozen=True)
class EngineInfo:
    target_name: str
    draft_name: str | None
    device: str
    dtype_name: str


@dataclass(frozen=True)
class Factory:
    """A callable named by import path, with keyword arguments: what a spawned process can be given."""

    path: str  # "package.module:function"
    kwargs: dict[str, Any] = field(default_factory=dict)
    # Called once in the child before its first job, with no arguments: heavy imports that the first call
    # needs anyway then run while the GUI is still starting.
    warm: str | None = None

    def resolve(self) -> Callable[..., Any]:
        fn = _named(self.path)
        return lambda *args: fn(*args, **self.kwargs)

    def warm_up(self) -> None:
        if self.warm is not None:
            _named(self.warm)()


def _named(path: str) -> Callable[..., Any]:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


DEFAULT_LOADER = Factory("engine.service.process:default_loader", warm="engine.service.process:warm_engine")
DEFAULT_LISTER = Factory("engine.service.process:default_lister")


def default_loader(target: str | None, draft: str | None, device: str | None, progress: Progress,
                   cancelled: Callable[[], bool]) -> Any:
    """Provision the embedded pair when no target is given, then load_engine."""
    from engine.io.loading import load_engine

    if target is None:
        from engine.io.provision import default_pair

        target_dir, draft_dir = default_pair(progress, cancelled)
        target, draft = str(target_dir), str(draft_dir)
    return load_engine(target, draft, device=device, progress=progress)


def warm_engine() -> None:
    """Import torch and the engine and load the compiled kernels (~1.3 s): what every load starts with."""
    import engine.io.loading  # noqa: F401 - torch and the engine, imported for their side of the warm-up
    from engine.quant import ext

    ext.load()


def default_lister() -> list[Any]:
    from engine.io.hub import list_local_models

    return list_local_models()


def describe_error(e: BaseException) -> str:
    """One line for the user: known engine errors speak for themselves, anything else names its type."""
    name = type(e).__name__
    if name in ("ModelLoadError", "ProvisionError", "FileNotFoundError"):
        return str(e) or name
    return f"{name}: {e}" if str(e) else name


def info_of(engine: Any) -> EngineInfo:
    return EngineInfo(str(engine.target_name), engine.draft_name, str(getattr(engine, "device", "cpu")),
                      str(getattr(engine, "dtype_name", "")))


def rss_bytes() -> int:
    """This process's resident set size (Linux /proc; elsewhere the peak from getrusage)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _blocks(pool: Any) -> tuple[int | None, int | None]:
    manager = getattr(pool, "manager", None)
    return (manager.num_free, manager.num_blocks) if manager is not None else (None, None)


class Service:
    """The child's state: one engine, a job queue run by the main thread, a reader thread for commands."""

    def __init__(self, conn: Any, loader: Factory, lister: Factory) -> None:
        self.conn = conn
        self.warm_up = loader.warm_up
        self.loader = loader.resolve()
        self.lister = lister.resolve()
        self.engine: Any = None
        self.jobs: queue.Queue[tuple] = queue.Queue()
        self.requests: dict[int, Controls] = {}  # queued or running generate requests
        self.load_cancel: threading.Event | None = None
        self._send_lock = threading.Lock()
        self._unfinished = 0  # jobs queued or running: counted when queued, so no moment reads "idle" in between
        self._unfinished_lock = threading.Lock()

    def send(self, *message: Any) -> None:
        with self._send_lock:  # both threads send: one message at a time on the pipe
            self.conn.send(message)

    # ---- reader thread ---------------------------------------------------------------------------------------
    def read_commands(self) -> None:
        while True:
            try:
                cmd = self.conn.recv()
            except (EOFError, OSError):  # the GUI went away: stop what runs and leave
                cmd = ("shutdown",)
            kind = cmd[0]
            if kind == "controls":
                c = self.requests.get(cmd[1])
                if c is not None:
                    c.sampling, c.spec = cmd[2], cmd[3]
            elif kind == "cancel":
                self._cancel(cmd[1])
            elif kind == "cancel_load":
                if self.load_cancel is not None:
                    self.load_cancel.set()
            elif kind == "status":
                self.send("status", self.status())
            elif kind in ("step", "continue", "stepping"):
                self._step(kind, *cmd[1:])
            else:
                if kind == "generate":  # registered now, so a cancel that follows finds it in the queue
                    self.requests[cmd[1]] = Controls(cmd[3], cmd[4])
                    self.requests[cmd[1]].gate.set_stepping(len(cmd) > 5 and bool(cmd[5]))
                    cmd = cmd[:5]
                elif kind == "load":
                    self.load_cancel = threading.Event()
                    cmd = (*cmd, self.load_cancel)
                elif kind == "shutdown":
                    self._cancel(None)
                    if self.load_cancel is not None:
                        self.load_cancel.set()
                with self._unfinished_lock:
                    self._unfinished += 1
                self.jobs.put(cmd)
                if kind == "shutdown":
                    return

    def _step(self, kind: str, rid: int, on: bool = True) -> None:
        c = self.requests.get(rid)
        if c is None:  # finished meanwhile: nothing waits
            return
        if kind == "step":
            c.gate.step()
        else:
            c.gate.set_stepping(kind == "stepping" and on)

    def _cancel(self, rid: int | None) -> None:
        for key, c in list(self.requests.items()):
            if rid is None or key == rid:
                c.cancel()

    def status(self) -> dict[str, Any]:
        # `busy` first: this thread is the only one that queues jobs, so once it reads "idle" nothing can change
        # the engine until it has counted the blocks. Read last, a job finishing in between (a reset freeing
        # every block) gave "idle" beside the counts from before it.
        busy = self._unfinished > 0
        e = self.engine
        target = _blocks(getattr(e, "target_pool", None))
        drafter = getattr(e, "model_drafter", None)
        draft = _blocks(getattr(drafter, "pool", None))
        return {"pid": os.getpid(), "rss_bytes": rss_bytes(), "busy": busy,
                "target_free_blocks": target[0], "target_total_blocks": target[1],
                "draft_free_blocks": draft[0], "draft_total_blocks": draft[1]}

    # ---- main thread -----------------------------------------------------------------------------------------
    def run(self) -> None:
        reader = threading.Thread(target=self.read_commands, name="speclens-commands", daemon=True)
        reader.start()
        self.send("started", os.getpid())
        try:
            self.warm_up()
        except Exception:  # noqa: BLE001 - the load itself reports what is wrong, as a message
            log.warning("warming up the engine failed:\n%s", traceback.format_exc())
        while True:
            cmd = self.jobs.get()
            kind = cmd[0]
            if kind == "shutdown":
                return
            try:
                if kind == "load":
                    self.load(*cmd[1:])
                elif kind == "generate":
                    self.generate(*cmd[1:])
                elif kind == "reset":
                    if self.engine is not None:
                        self.engine.reset()
                elif kind == "scan":
                    self.scan()
            finally:
                with self._unfinished_lock:
                    self._unfinished -= 1

    def load(self, target: str | None, draft: str | None, device: str | None, cancel: threading.Event) -> None:
        last = [0.0, ""]

        def progress(stage: str, fraction: float) -> None:
            now = time.monotonic()
            if stage != last[1] or now - last[0] >= PROGRESS_INTERVAL_S or fraction >= 1.0:
                last[0], last[1] = now, stage
                self.send("load_progress", stage, float(fraction))

        try:
            engine = self.loader(target, draft, device, progress, cancel.is_set)
        except Exception as e:  # noqa: BLE001 - every failure becomes a message, never a crash
            if cancel.is_set():
                self.send("load_cancelled")
            else:
                log.warning("model load failed:\n%s", traceback.format_exc())
                self.send("load_failed", describe_error(e))
            return
        if cancel.is_set():  # Engine.load itself cannot be interrupted: drop what it built
            del engine
            self.send("load_cancelled")
            return
        self.engine = engine
        self.send("loaded", info_of(engine))

    def scan(self) -> None:
        try:
            models = list(self.lister())
        except Exception:  # noqa: BLE001 - an unreadable cache only empties the picker
            log.warning("listing local models failed:\n%s", traceback.format_exc())
            models = []
        self.send("models", models)

    def generate(self, rid: int, messages: list[dict[str, str]], sampling: Any, spec: Any) -> None:
        controls = self.requests[rid]
        batch: list = []
        try:
            if controls.cancelled:  # cancelled while it waited in the queue
                return
            if self.engine is None:
                raise RuntimeError("no model is loaded yet")
            ids = self.engine.encode_chat(messages)
            sent = 0.0

            def on_phase(event: Any) -> None:  # step-through: the rounds so far go first, then the pause
                if batch:
                    self.send("rounds", rid, list(batch))
                    batch.clear()
                self.send("phase", rid, event)

            controls.on_phase = on_phase
            for item in self.engine.generate(ids, sampling, spec, controls):
                if isinstance(item, Summary):
                    if batch:
                        self.send("rounds", rid, batch)
                        batch = []
                    self.send("summary", rid, item)
                    continue
                batch.append(item)
                now = time.monotonic()
                if now - sent >= BATCH_S:
                    self.send("rounds", rid, batch)
                    batch, sent = [], now
        except Exception as e:  # noqa: BLE001
            log.warning("generation failed:\n%s", traceback.format_exc())
            if batch:  # the rounds that did complete still reach the GUI, before the error
                self.send("rounds", rid, batch)
            self.send("errored", rid, describe_error(e))
        finally:
            self.requests.pop(rid, None)
            self.send("finished", rid)


def spawn(loader: Factory = DEFAULT_LOADER, lister: Factory = DEFAULT_LISTER) -> tuple[Any, Any]:
    """Start `serve` in a child made with the "spawn" context (never fork a process that runs Qt). Returns the
    process and the parent's end of the pipe. Needs no Qt, so the GUI can call it before importing Qt and the
    child imports torch while the window is built."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=serve, args=(child, loader, lister), name="speclens-engine", daemon=True)
    proc.start()
    child.close()  # our copy: the pipe reports EOF once the child's end is gone
    return proc, parent


def serve(conn: Any, loader: Factory = DEFAULT_LOADER, lister: Factory = DEFAULT_LISTER) -> None:
    """The child process's entry point."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s engine %(name)s: %(message)s")
    try:
        Service(conn, loader, lister).run()
    except BaseException as e:  # noqa: BLE001 - tell the GUI why, then exit non-zero
        log.error("engine loop failed:\n%s", traceback.format_exc())
        try:
            conn.send(("fatal", describe_error(e)))
        except OSError:
            pass
        raise SystemExit(1) from e
