"""The one interface the controller has to whatever answers its requests: the local engine process
(app/host.py: EngineHost) or an attached server (app/remote_host.py: RemoteHost).

A host is a QObject with HostSignals' signals (app/host_signals.py). `generate()` returns a RequestHandle
(app/request_handle.py) whose signals carry the typed events of engine.api.events (RoundEvent, PhaseEvent,
Summary), routed from the typed messages of engine.api.protocol (Rounds, PhaseReached, RequestSummary, Errored,
Finished) whichever host sent them. What a host cannot do (a server cannot step through a round, nor load a
model) it accepts and ignores, or answers with a sentence through its signals; it never raises.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from PySide6.QtCore import QObject, SignalInstance

from app.request_handle import RequestHandle
from engine.api.config import SamplingParams, SpecParams
from engine.api.protocol import EngineInfo


@dataclass(frozen=True)
class LoadRequest:
    target: str | None  # None: the embedded default pair (provisioned on first use)
    draft: str | None
    device: str | None
    context: int | None = None  # KV cache tokens; None: the models' limit, at most engine.api.config.DEFAULT_CONTEXT


@runtime_checkable
class Host(Protocol):
    loadProgress: SignalInstance  # (stage, fraction < 0: unknown)
    loaded: SignalInstance  # (EngineInfo)
    loadFailed: SignalInstance  # (one sentence)
    loadCancelled: SignalInstance
    modelsListed: SignalInstance  # (list of engine.io.hub.LocalModel)
    statusReady: SignalInstance  # (EngineStatus)
    died: SignalInstance  # (one sentence): every pending request is then the owner's to end (abandon)

    info: EngineInfo | None  # what answers now; None until loaded (or connected)
    loading: object | None  # what is being loaded (or connected to), None when nothing is
    pending: dict[int, RequestHandle]  # requests sent and not finished, by id

    @property
    def running(self) -> bool: ...

    @property
    def ready(self) -> bool: ...

    @property
    def busy(self) -> bool: ...

    def start(self) -> None: ...

    def shutdown(self, wait_s: float = ...) -> bool: ...

    def generate(self, messages: list[dict[str, str]], sampling: SamplingParams, spec: SpecParams,
                 stepping: bool = False, plain_every: int = 0) -> RequestHandle: ...

    def cancel_all(self) -> None: ...

    def reset(self) -> None: ...

    def load(self, target: str | None = None, draft: str | None = None, device: str | None = None,
             context: int | None = None) -> LoadRequest | None: ...

    def reload(self) -> LoadRequest | None: ...

    def cancel_load(self) -> None: ...

    def scan_models(self) -> None: ...

    def query_status(self) -> None: ...

    def setParent(self, parent: QObject | None) -> None: ...  # noqa: N802 - Qt naming

    def deleteLater(self) -> None: ...  # noqa: N802 - Qt naming
