"""The GUI's handle on an attached server (engine/remote/): a Host (app/host_protocol.py) as app/host.py's
EngineHost is one, with the same signals and `generate()` returning the same RequestHandle, so the controller and
the views do not change.

`RemoteHost(url, api_key, plain_url)`: `connect_server()` probes the server on a thread (loadProgress, then loaded
with an EngineInfo naming the server's model and kind, or loadFailed with one sentence). Each request streams on a
thread of its own (engine.remote.client); what it produces reaches the GUI thread through one queued signal as
the engine process's own typed messages (Rounds, RequestSummary, Errored, Finished: engine.api.protocol), its
rounds gathered by the engine's RoundBatcher to at most ~60 posts a second, so the window never waits on the
network and the handle's signals are the same as for a local request. Cancel sets the request's flag: the
stream's reader sees it within 50 ms and the handle gets its Summary (stop reason "cancelled") and finished().

What a server cannot do per request is refused with a sentence, never imitated: a request with speculation off
goes to the plain server (`plain_url`), or fails with "give a plain server URL" when there is none; live control
changes, step-through and the cache reset are not the server's to take (`update`, `step` do nothing).

The API key lives in this object only: not in EngineInfo, settings, traces, CSV or log lines.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import count
from typing import Any

from PySide6.QtCore import QObject, Qt, Signal

from app.host_signals import REQUEST_MESSAGES, HostSignals
from app.request_handle import RequestHandle
from app.thread_post import ThreadPost
from engine.api.config import SamplingParams, SpecParams
from engine.api.events import Summary
from engine.api.protocol import Cancel, EngineInfo, Errored, Finished, LoadFailed, RequestSummary
from engine.remote.client import OFF_PER_REQUEST, ServerClient, ServerInfo
from engine.remote.errors import RemoteError
from engine.service.streaming import RoundBatcher

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Probed:
    """The probe's answer, posted to the GUI thread: what the server (and the plain one) said about itself."""

    server: ServerInfo


def engine_info(info: ServerInfo) -> EngineInfo:
    """How the window names an attached server: its model where the local target's name goes (a file path, as
    llama-server names its model, by its file name), and its draft when it has one."""
    draft = _file_name(info.draft_model) if info.draft_model else ("its draft model" if info.speculative else None)
    return EngineInfo(_file_name(info.model), draft, info.label, "remote: " + info.kind)


def _file_name(model: str) -> str:
    """A model file's name without its folders; a hub id such as "org/model" stays whole."""
    return model.replace("\\", "/").rsplit("/", 1)[-1] if model.startswith(("/", ".")) or ":\\" in model else model


class RemoteHost(HostSignals):
    _post = Signal(object)  # worker thread -> GUI thread: one message (Probed, LoadFailed, or a request's)

    def __init__(self, url: str, api_key: str | None = None, plain_url: str | None = None, *,
                 connect_s: float = 5.0, read_s: float = 60.0, parent: QObject | None = None) -> None:
        """Raises RemoteError at once for a URL that is not http(s)."""
        super().__init__(parent)
        self.client = ServerClient(url, api_key, connect_s=connect_s, read_s=read_s)
        self.plain = ServerClient(plain_url, api_key, connect_s=connect_s, read_s=read_s) if plain_url else None
        self.server: ServerInfo | None = None
        self.info: EngineInfo | None = None
        self.loading: object | None = None
        self._cancels: dict[int, threading.Event] = {}
        self._threads: list[threading.Thread] = []
        self._ids = count(1_000_001)  # never an id the local engine's host gives: both share the controller
        self._handlers: dict[type, Callable[[Any], None]] = {
            Probed: self._on_probed,
            LoadFailed: self._on_probe_failed,
            **{kind: self._on_request_message for kind in REQUEST_MESSAGES},
        }
        self._post.connect(self._dispatch, Qt.ConnectionType.QueuedConnection)
        self._emit = self._post.emit  # bound here, on the GUI thread: threads reach it only through _mail
        self._mail = ThreadPost()  # shut by shutdown(), before the controller lets this host go
        self.destroyed.connect(self._mail.close)  # and, should an owner delete it without shutdown, as it goes

    # ---- the server ------------------------------------------------------------------------------------------
    def connect_server(self) -> None:
        """Probe the server (and the plain one) on a thread; answered by loaded or loadFailed."""
        self.loading = self.client.public
        self.loadProgress.emit(f"Connecting to {self.client.public}\u2026", -1.0)
        self._start(self._probe, 0)

    def _probe(self, _rid: int) -> None:
        try:
            self.client.probe()
            if self.plain is not None:
                self.plain.probe()
            else:  # speculation off needs a plain server, unless this one takes it per request: ask it
                self.client.check_per_request_spec()
            self._send(Probed(self.client.info))
        except RemoteError as e:
            self._send(LoadFailed(str(e)))

    def _send(self, message: object) -> None:
        """Worker thread -> GUI thread; nothing once shut down (the host may be on its way to deletion)."""
        self._mail.post(self._emit, message)

    @property
    def running(self) -> bool:
        return True

    @property
    def ready(self) -> bool:
        return self.info is not None

    def start(self) -> None:
        pass  # nothing to start: the server runs on its own

    def shutdown(self, wait_s: float = 2.0) -> bool:
        """Cancel every request and wait (bounded) for their threads. Final: what a thread still produces after
        it reaches nobody, so the host can be deleted at once even while a probe or a stream is still ending."""
        self.cancel_all()
        self.client.abort()
        if self.plain is not None:
            self.plain.abort()
        deadline = time.monotonic() + wait_s
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))
        self._mail.close()
        return all(not t.is_alive() for t in self._threads)

    # ---- requests --------------------------------------------------------------------------------------------
    def generate(self, messages: list[dict[str, str]], sampling: SamplingParams, spec: SpecParams,
                 stepping: bool = False, plain_every: int = 0) -> RequestHandle:
        """stepping and plain steps are not the server's to do: the request runs as set, without pausing."""
        handle = RequestHandle(next(self._ids), self._command)
        self.pending[handle.id] = handle
        self._cancels[handle.id] = threading.Event()
        self._start(lambda rid: self._stream(rid, messages, sampling, spec), handle.id)
        return handle

    def _client_for(self, spec: SpecParams) -> tuple[ServerClient, bool, dict | None]:
        """Which server answers, whether it drafts, and the per-request fields that make it so."""
        per_request = self.server is not None and self.server.per_request_spec is True
        if spec.enabled:
            return self.client, True, ({"speculative.n_max": spec.k, "speculative.n_min": 0} if per_request else None)
        if self.plain is not None:
            return self.plain, False, None
        if per_request:
            return self.client, False, OFF_PER_REQUEST
        raise RemoteError(f"{self.client.public} cannot turn speculation off per request: give a plain server "
                          "(the same model without a draft) in File \u203a Attach to server\u2026 to compare")

    def _stream(self, rid: int, messages: list[dict[str, str]], sampling: SamplingParams, spec: SpecParams) -> None:
        """Worker thread: the reply's rounds, batched, then its Summary or an error, then Finished: what the engine
        process sends for a request (engine.service.streaming.stream)."""
        rounds = RoundBatcher(rid, self._send)
        try:
            client, speculative, extra = self._client_for(spec)
            for item in client.chat(messages, sampling, speculative=speculative, cancel=self._cancels[rid],
                                    extra=extra):
                if isinstance(item, Summary):
                    rounds.flush()
                    self._send(RequestSummary(rid, item))
                    continue
                for event in item:
                    rounds.add(event)
        except RemoteError as e:
            rounds.flush()  # the rounds that did arrive still reach the window, before the error
            self._send(Errored(rid, str(e)))
        except Exception as e:  # noqa: BLE001 - a bug here must still end the request in the window
            log.exception("attached request %d failed", rid)
            rounds.flush()
            self._send(Errored(rid, f"the attached request failed: {type(e).__name__}: {e}"))
        rounds.flush()
        self._send(Finished(rid))

    def _start(self, target: Callable[[int], None], rid: int) -> None:
        self._threads = [t for t in self._threads if t.is_alive()]
        t = threading.Thread(target=target, args=(rid,), name=f"speclens-remote-{rid}", daemon=True)
        self._threads.append(t)
        t.start()

    def _command(self, command: object) -> bool:
        """What a RequestHandle sends: Cancel acts; live controls and step-through do not reach a server."""
        if isinstance(command, Cancel):
            self.cancel(command.rid)
        return True

    def cancel(self, rid: int | None = None) -> None:
        for key, flag in self._cancels.items():
            if rid is None or key == rid:
                flag.set()

    def cancel_all(self) -> None:
        self.cancel(None)

    def reset(self) -> None:
        pass  # the server keeps (or drops) its own prompt cache

    def load(self, *_: Any) -> None:
        self.connect_server()

    def reload(self) -> None:
        self.connect_server()

    def cancel_load(self) -> None:
        """Stop connecting: a probe under way on its thread ends within the client's poll (ServerClient.abort)
        and posts a failure that says it was cancelled; loadCancelled answers at once."""
        if self.loading is None:
            return
        self.client.abort()
        if self.plain is not None:
            self.plain.abort()
        self.loading = None
        self.loadCancelled.emit()

    def scan_models(self) -> None:
        pass

    def query_status(self) -> None:
        pass

    # ---- GUI thread ------------------------------------------------------------------------------------------
    def _dispatch(self, message: object) -> None:
        self._handlers[type(message)](message)

    def _on_probed(self, m: Probed) -> None:
        if self.loading is None:  # answered after a cancel: the user no longer wants it
            return
        self.server, self.info, self.loading = m.server, engine_info(m.server), None
        self.loaded.emit(self.info)

    def _on_probe_failed(self, m: LoadFailed) -> None:
        if self.loading is None:  # cancelled: loadCancelled has answered already
            return
        self.loading = None
        self.loadFailed.emit(m.message)

    def _on_request_message(self, m: Any) -> None:
        if isinstance(m, Finished):
            self._cancels.pop(m.rid, None)
        self.deliver(m)
