"""The one place the GUI meets the engine: a QObject living in its own QThread.

`EngineWorker` runs in the worker thread; its slots are invoked through queued signals from `EngineHost`,
which lives in the GUI thread and is what the window talks to. Requests therefore run one at a time in order.
Cancelling never goes through the event loop (the worker is busy in the round loop): the GUI thread calls
`Controls.cancel()` directly and the engine stops between rounds. Live settings work the same way: the window
replaces `controls.sampling` / `controls.spec` and the engine reads them at the start of the next round.

Worker signals (all delivered to the GUI thread as queued connections):

    loadProgress(str, float)    stage text, fraction done in [0, 1] (-1: unknown)
    loaded(object)              EngineInfo of the engine now in use
    loadFailed(str)             a readable reason; the previous engine (if any) stays in use
    loadCancelled()             the user cancelled; the previous engine stays in use
    modelsListed(list)          engine.hub.LocalModel entries for the model picker
    roundsReady(int, list)      request id, RoundEvents in order: one per signal while rounds take longer
                                than BATCH_S (16 ms), several when they come faster (each round is sent
                                once, none waits longer than the next round takes)
    summaryReady(int, object)   request id, Summary (exactly once per request that ran to a stop or a cancel)
    errored(int, str)           request id, readable message (the request produced no Summary)
    finished(int)               request id; always last for every request, after summaryReady or errored

Only this module and app.main import engine.engine (and with it torch), and only lazily.
"""
from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import count
from typing import Any

from PySide6.QtCore import QObject, QThread, Signal, Slot

from engine.config import SamplingParams, SpecParams
from engine.events import Summary

log = logging.getLogger(__name__)

Progress = Callable[[str, float], None]
Loader = Callable[[str | None, str | None, str | None, Progress, Callable[[], bool]], Any]


@dataclass(frozen=True)
class EngineInfo:
    target_name: str
    draft_name: str | None
    device: str
    dtype_name: str


@dataclass
class Request:
    """One generate call. `controls` is the engine's Controls: the GUI thread may change it while it runs."""

    id: int
    tag: str
    messages: list[dict[str, str]]
    sampling: SamplingParams
    spec: SpecParams
    controls: Any
    meta: dict[str, Any] = field(default_factory=dict)

    def cancel(self) -> None:
        self.controls.cancel()


@dataclass
class LoadRequest:
    target: str | None  # None: the embedded default pair (provisioned on first use)
    draft: str | None
    device: str | None
    cancel: threading.Event = field(default_factory=threading.Event)


def default_loader(target: str | None, draft: str | None, device: str | None, progress: Progress,
                   cancelled: Callable[[], bool]) -> Any:
    """Provision the default pair when no target is given, then Engine.load."""
    from engine.engine import Engine

    if target is None:
        from engine.provision import default_pair

        target_dir, draft_dir = default_pair(progress, cancelled)
        target, draft = str(target_dir), str(draft_dir)
    return Engine.load(target, draft, device=device, progress=progress)


def default_controls(sampling: SamplingParams, spec: SpecParams) -> Any:
    from engine.engine import Controls

    return Controls(sampling, spec)


def default_lister() -> list[Any]:
    from engine.hub import list_local_models

    return list_local_models()


def describe_error(e: BaseException) -> str:
    """A message for a dialog: known engine errors speak for themselves, anything else names its type."""
    name = type(e).__name__
    if name in ("ModelLoadError", "ProvisionError", "FileNotFoundError"):
        return str(e) or name
    return f"{name}: {e}" if str(e) else name


class EngineWorker(QObject):
    loadProgress = Signal(str, float)
    loaded = Signal(object)
    loadFailed = Signal(str)
    loadCancelled = Signal()
    modelsListed = Signal(list)
    roundsReady = Signal(int, list)
    summaryReady = Signal(int, object)
    errored = Signal(int, str)
    finished = Signal(int)

    PROGRESS_INTERVAL_S = 0.05  # at most ~20 progress signals a second
    BATCH_S = 0.016  # at most ~60 round signals a second: each costs the GUI thread a wake-up and the GIL

    def __init__(self, engine: Any = None, *, loader: Loader = default_loader,
                 lister: Callable[[], list[Any]] = default_lister) -> None:
        super().__init__()
        self.engine = engine
        self._loader = loader
        self._lister = lister

    @Slot(object)
    def load(self, req: LoadRequest) -> None:
        last = [0.0, ""]

        def progress(stage: str, fraction: float) -> None:
            now = time.monotonic()
            if stage != last[1] or now - last[0] >= self.PROGRESS_INTERVAL_S or fraction >= 1.0:
                last[0], last[1] = now, stage
                self.loadProgress.emit(stage, float(fraction))

        try:
            engine = self._loader(req.target, req.draft, req.device, progress, req.cancel.is_set)
        except Exception as e:  # noqa: BLE001 - every failure becomes a dialog, never a crash
            if req.cancel.is_set():
                self.loadCancelled.emit()
            else:
                log.warning("model load failed:\n%s", traceback.format_exc())
                self.loadFailed.emit(describe_error(e))
            return
        if req.cancel.is_set():  # Engine.load itself cannot be interrupted: drop what it built
            del engine
            self.loadCancelled.emit()
            return
        self.engine = engine
        info = info_of(engine)
        log.info("loaded %s + %s on %s (%s)", info.target_name, info.draft_name, info.device, info.dtype_name)
        self.loaded.emit(info)

    @Slot()
    def scan_models(self) -> None:
        try:
            models = self._lister()
        except Exception:  # noqa: BLE001 - an unreadable cache only empties the picker
            log.warning("listing local models failed:\n%s", traceback.format_exc())
            models = []
        self.modelsListed.emit(list(models))

    @Slot()
    def reset(self) -> None:
        if self.engine is not None:
            self.engine.reset()

    @Slot(object)
    def generate(self, req: Request) -> None:
        batch: list = []
        try:
            if req.controls.cancelled:  # cancelled while it waited in the queue
                return
            if self.engine is None:
                raise RuntimeError("no model is loaded yet")
            ids = self.engine.encode_chat(req.messages)
            sent = 0.0
            for item in self.engine.generate(ids, req.sampling, req.spec, req.controls):
                if isinstance(item, Summary):
                    if batch:
                        self.roundsReady.emit(req.id, batch)
                        batch = []
                    self.summaryReady.emit(req.id, item)
                    continue
                batch.append(item)
                now = time.monotonic()
                if now - sent >= self.BATCH_S:
                    self.roundsReady.emit(req.id, batch)
                    batch, sent = [], now
        except Exception as e:  # noqa: BLE001
            log.warning("generation failed:\n%s", traceback.format_exc())
            if batch:  # the rounds that did complete still reach the GUI, before the error
                self.roundsReady.emit(req.id, batch)
            self.errored.emit(req.id, describe_error(e))
        finally:
            self.finished.emit(req.id)


def info_of(engine: Any) -> EngineInfo:
    return EngineInfo(str(engine.target_name), engine.draft_name, str(getattr(engine, "device", "cpu")),
                      str(getattr(engine, "dtype_name", "")))


GIL_SWITCH_INTERVAL_S = 0.001


class EngineHost(QObject):
    """GUI-thread handle on the worker thread. Make requests here; connect to `worker`'s signals.

    The GUI thread shares the GIL with the engine thread, whose Python glue between torch kernels can keep
    it busy. Painting hands the GIL back and forth many times, and each time the GUI thread may wait up to
    the interpreter's switch interval for it (5 ms by default), so a paint can take several times longer.
    The host lowers the interval to 1 ms; the engine only pays for a switch when the GUI wants the GIL.
    """

    _load = Signal(object)
    _generate = Signal(object)
    _reset = Signal()
    _scan = Signal()

    def __init__(self, engine: Any = None, *, loader: Loader = default_loader,
                 controls_factory: Callable[[SamplingParams, SpecParams], Any] = default_controls,
                 lister: Callable[[], list[Any]] = default_lister, parent: QObject | None = None) -> None:
        super().__init__(parent)
        sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_INTERVAL_S))
        self._controls_factory = controls_factory
        self._ids = count(1)
        self.pending: dict[int, Request] = {}
        self.loading: LoadRequest | None = None
        self.info: EngineInfo | None = info_of(engine) if engine is not None else None
        self.thread = QThread()
        self.thread.setObjectName("speclens-engine")
        self.worker = EngineWorker(engine, loader=loader, lister=lister)
        self.worker.moveToThread(self.thread)
        self._load.connect(self.worker.load)
        self._generate.connect(self.worker.generate)
        self._reset.connect(self.worker.reset)
        self._scan.connect(self.worker.scan_models)
        self.worker.finished.connect(self._on_finished)
        self.worker.loaded.connect(self._on_loaded)
        self.worker.loadFailed.connect(self._on_load_done)
        self.worker.loadCancelled.connect(self._on_load_done)
        self.thread.start()

    @property
    def busy(self) -> bool:
        return bool(self.pending)

    @property
    def ready(self) -> bool:
        return self.info is not None

    def generate(self, messages: list[dict[str, str]], sampling: SamplingParams, spec: SpecParams,
                 tag: str = "chat") -> Request:
        req = Request(next(self._ids), tag, list(messages), sampling, spec, self._controls_factory(sampling, spec))
        self.pending[req.id] = req
        self._generate.emit(req)
        return req

    def cancel_all(self) -> None:
        for req in self.pending.values():
            req.cancel()

    def load(self, target: str | None = None, draft: str | None = None, device: str | None = None) -> LoadRequest:
        """Load in the background (target None: the embedded pair). The current engine stays until it succeeds."""
        req = LoadRequest(target, draft, device)
        self.loading = req
        self._load.emit(req)
        return req

    def cancel_load(self) -> None:
        if self.loading is not None:
            self.loading.cancel.set()

    def reset(self) -> None:
        self._reset.emit()

    def scan_models(self) -> None:
        self._scan.emit()

    def shutdown(self, wait_ms: int = 5000) -> bool:
        """Cancel everything and stop the thread. Returns whether it stopped in time."""
        self.cancel_all()
        self.cancel_load()
        self.thread.quit()
        return self.thread.wait(wait_ms)

    def _on_finished(self, rid: int) -> None:
        self.pending.pop(rid, None)

    def _on_loaded(self, info: EngineInfo) -> None:
        self.info = info
        self.loading = None

    def _on_load_done(self, *_: object) -> None:
        self.loading = None
