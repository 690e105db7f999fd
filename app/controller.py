"""The app's state apart from its views: the conversation, the requests, the session stats and the engine host.

`ChatController` turns the host's signals and those of each request's handle into what the views need. The
window subscribes to the chat signals; `CompareDialog` and the K tuner to the handles of the requests they
submitted (`submit()` returns them, in `Request.handle`, with the controller's own slots connected first, so a
request's record is up to date when theirs run). Neither talks to the host.

Chat reply (the main window's conversation), in order for one reply:

    replyStarted(str, str)      the user's text, the title of the reply (the target's name)
    prefillArrived(object)      PrefillProgress of a long prompt (the target's reading, the draft's catch-up)
    roundsArrived(list)         RoundEvents of the reply, in order
    then one of:
      replyDone(object)         its Summary (also for a cancelled reply)
      replyFailed(str)          the engine raised: the reply ends with the rounds that did arrive
      replyInterrupted(str)     the engine process died: its one-sentence cause
    replyFinished()             always last

Step-through (`stepping` on when the reply starts, or set_stepping() mid-reply): after each phase of a round the
engine waits, and phaseArrived(object) brings its PhaseEvent (`paused` holds it); step() runs the next phase,
resume() the rest of the reply, stop() cancels it (the paused round finishes first).

When the engine process dies, every request's handle ends with errored(the death's sentence), then finished().

Models and the process: loadProgress(str, float), loaded(object) (EngineInfo), loadFailed(str),
loadCancelled(), modelsListed(list), engineDied(str) (one sentence; the chat, the charts and the stats stay),
chatCleared(), stateChanged() (busy, ready or loading changed).

Attach mode (attach(): the controller builds the server's host, app/attach.py): attachProgress(str) while it
connects, then attachDone(object) (an app.attach.Attached; replies go to the server from now on, and loaded()
names its model) or attachFailed(str) (one sentence; nothing changed); cancel_attach() stops connecting
(attachCancelled()).

The controller knows its hosts only as app/host_protocol.Host: the local engine process's (given) and an
attached server's (built here).
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import partial

from PySide6.QtCore import QObject, Signal

from app.attach import Attached, AttachError, attached, remote_host
from app.host_protocol import Host, LoadRequest
from app.request_handle import RequestHandle
from engine.analysis.stats import MessageRecord, SessionStats
from engine.api.config import SamplingParams, SpecParams
from engine.api.events import PhaseEvent, RoundEvent, Summary
from engine.api.messages import replace_surrogates

Messages = list[dict[str, str]]

# A chat reply's measured speedup is speculative tokens/s over plain tokens/s, and on a machine whose load changes
# from one minute to the next both rates must come from the same minutes. So the local engine makes a run of
# engine.api.live.PLAIN_RUN rounds in every PLAIN_EVERY plain steps (plain_step_due: by round number, so a sampled
# reply stays the same from the same seed; under greedy decoding they commit the very tokens speculation would have).
# The charts (app/views/chart_data.py) set the speculative rounds' wall time against these steps'.
PLAIN_EVERY = 16


@dataclass
class Request:
    """One reply the controller asked for, and where its rounds are recorded."""

    id: int
    kind: str  # the stats record kind: "chat", "compare-plain", "compare-speculative"
    messages: Messages
    sampling: SamplingParams
    spec: SpecParams
    record: MessageRecord
    handle: RequestHandle = field(repr=False)
    failed: bool = False  # ended with an error or the engine's death

    def cancel(self) -> None:
        self.handle.cancel()


class ChatController(QObject):
    replyStarted = Signal(str, str)
    prefillArrived = Signal(object)
    roundsArrived = Signal(list)
    phaseArrived = Signal(object)
    replyDone = Signal(object)
    replyFailed = Signal(str)
    replyInterrupted = Signal(str)
    replyFinished = Signal()
    loadProgress = Signal(str, float)
    loaded = Signal(object)
    loadFailed = Signal(str)
    loadCancelled = Signal()
    modelsListed = Signal(list)
    engineDied = Signal(str)
    chatCleared = Signal()
    stateChanged = Signal()
    attachProgress = Signal(str)
    attachDone = Signal(object)
    attachFailed = Signal(str)
    attachCancelled = Signal()

    def __init__(self, host: Host, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.host = host
        host.setParent(self)
        self.stats = SessionStats()
        self.conversation: Messages = []
        self.requests: dict[int, Request] = {}  # running or queued
        self.active: Request | None = None  # the chat reply running now
        self.last_request: tuple[Messages, SamplingParams, SpecParams] | None = None  # what Compare replays
        self.death: str | None = None  # why the engine process ended, until it is reloaded
        self.stepping = False  # step-through for the chat replies sent from now on
        self.paused: PhaseEvent | None = None  # the phase the active reply waits after, while stepping
        self.remote: Host | None = None  # the attached server's host: replies go there
        self.attachment: Attached | None = None  # what the views may know of it
        self.connecting: Host | None = None  # a server's host while it is being connected to
        host.died.connect(self._on_died)
        host.loadProgress.connect(self.loadProgress)
        host.loaded.connect(self._on_loaded)
        host.loadFailed.connect(self._on_load_failed)
        host.loadCancelled.connect(self._on_load_cancelled)
        host.modelsListed.connect(self.modelsListed)

    # ---- state ---------------------------------------------------------------------------------------------
    @property
    def busy(self) -> bool:
        return bool(self.requests)

    @property
    def source(self) -> Host:
        """Where replies go: the attached server, else the local engine."""
        return self.remote if self.remote is not None else self.host

    @property
    def ready(self) -> bool:
        return self.source.ready

    @property
    def loading(self) -> bool:
        return self.host.loading is not None

    @property
    def local_ready(self) -> bool:
        """The local engine has a model loaded (attached or not)."""
        return self.host.ready

    @property
    def info(self):
        return self.source.info

    # ---- chat ----------------------------------------------------------------------------------------------
    def messages_for(self, text: str, system: str = "") -> Messages:
        head = [{"role": "system", "content": system}] if system else []
        return head + self.conversation + [{"role": "user", "content": text}]

    def send(self, text: str, sampling: SamplingParams, spec: SpecParams, system: str = "") -> bool:
        """Start a chat reply; False (and nothing changes) while no model is ready or a request runs."""
        if not text or not self.ready or self.busy:
            return False
        # A lone surrogate (a paste) is not Unicode text: the engine would refuse it, and saving could not write it
        text, system = replace_surrogates(text), replace_surrogates(system)
        messages = self.messages_for(text, system)
        self.conversation.append({"role": "user", "content": text})
        self.active = self.submit(messages, sampling, spec, "chat", text, stepping=self.stepping,
                                  plain_every=PLAIN_EVERY)
        self.last_request = (messages, sampling, spec)
        self.replyStarted.emit(text, self.info.target_name if self.info else "Assistant")
        return True

    def submit(self, messages: Messages, sampling: SamplingParams, spec: SpecParams, kind: str,
               prompt: str | None = None, stepping: bool = False, plain_every: int = 0) -> Request:
        """Any request: its rounds go into the session stats as `kind` (plain_every: PLAIN_EVERY's)."""
        if prompt is None:
            prompt = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
        handle = self.source.generate(messages, sampling, spec, stepping, plain_every)
        record = self.stats.begin(prompt, kind)
        record.messages, record.sampling, record.spec = [dict(m) for m in messages], sampling, spec  # for traces
        record.target, record.draft = (self.info.target_name, self.info.draft_name) if self.info else (None, None)
        record.engine = self.info.device if self.info else None  # an attached server's URL carries no credentials
        req = Request(handle.id, kind, messages, sampling, spec, record, handle)
        self.requests[req.id] = req
        # Slots that name the request by id: the handle holds them, and must not hold the request in a circle
        handle.prefill.connect(partial(self._on_prefill, req.id))
        handle.rounds.connect(partial(self._on_rounds, req.id))
        handle.phase.connect(partial(self._on_phase, req.id))
        handle.summary.connect(partial(self._on_summary, req.id))
        handle.errored.connect(partial(self._on_error, req.id))
        handle.finished.connect(partial(self._on_finished, req.id))
        self.stateChanged.emit()
        return req

    def update_controls(self, sampling: SamplingParams, spec: SpecParams) -> None:
        """Live settings reach the running chat reply at its next round."""
        if self.active is not None:
            req = self.active
            req.sampling = sampling
            req.handle.update(sampling, spec)

    def cancel(self, rid: int) -> None:
        if rid in self.requests:
            self.requests[rid].cancel()

    def forget_cache(self) -> None:
        """The engine forgets its cached prefix (the conversation stays; its next turn prefills in full)."""
        self.host.reset()

    # ---- step-through --------------------------------------------------------------------------------------
    def set_stepping(self, on: bool) -> None:
        """Step-through on or off, for the running chat reply too (on: it pauses after its next phase)."""
        self.stepping = on
        if self.active is not None:
            self.active.handle.set_stepping(on)
            if not on:
                self.paused = None
        self.stateChanged.emit()

    def step(self) -> bool:
        """Run the paused reply to its next phase; False when nothing is paused."""
        if self.active is None or self.paused is None:
            return False
        self.paused = None
        self.active.handle.step()
        self.stateChanged.emit()
        return True

    def resume(self) -> bool:
        """Let the paused reply run to its end without pausing (step-through stays on for the next one)."""
        if self.active is None or self.paused is None:
            return False
        self.paused = None
        self.active.handle.resume()
        self.stateChanged.emit()
        return True

    def stop(self) -> bool:
        """Cancel every running request; returns whether there was one."""
        if not self.busy:
            return False
        self.source.cancel_all()
        return True

    def new_chat(self) -> None:
        """Clear the conversation and the engine's cached prefix; the session's stats stay."""
        self.source.cancel_all()
        if self.active is not None:  # its late rounds are dropped; the request still finishes
            self.active = self.paused = None
        self.conversation.clear()
        self.last_request = None
        self.stats.new_chat()
        self.host.reset()
        self.chatCleared.emit()
        self.stateChanged.emit()

    def compare_request(self) -> tuple[Messages, SamplingParams, SpecParams] | None:
        """What Compare replays: the last prompt and its settings, with a fixed seed (both sides need the same
        one); None before any message, or while busy or not ready."""
        if self.last_request is None or self.busy or not self.ready:
            return None
        messages, sampling, spec = self.last_request
        if sampling.seed is None:
            sampling = sampling.with_(seed=random.randrange(2**31))
        return messages, sampling, spec

    # ---- models --------------------------------------------------------------------------------------------
    def load(self, target: str | None = None, draft: str | None = None, device: str | None = None,
             context: int | None = None) -> bool:
        """Load in the engine process (None: the embedded pair; context None: the default length); False while a
        load runs already."""
        if self.loading:
            return False
        if not self.host.running:
            self.host.start()
        self.host.load(target, draft, device, context)
        self.stateChanged.emit()
        return True

    def reload(self) -> LoadRequest:
        """A fresh engine process loading the pair in use before (after a crash)."""
        self.death = None
        req = self.host.reload()
        self.stateChanged.emit()
        return req

    def cancel_load(self) -> None:
        self.host.cancel_load()

    def scan_models(self) -> None:
        if not self.host.running:
            self.host.start()
        self.host.scan_models()

    def shutdown(self) -> bool:
        self._drop_connecting()
        self.detach()
        return self.host.shutdown()

    # ---- attach mode (app/attach.py) -----------------------------------------------------------------------
    def attach(self, url: str, plain_url: str | None = None, api_key: str | None = None) -> bool:
        """Connect to a server in the background (key: api_key, else $SPECLENS_API_KEY); once it answers, replies
        go there. The chat and the local engine stay as they are. False (and attachFailed) for a URL that cannot
        be one."""
        try:
            remote = remote_host(url, plain_url, api_key)
        except AttachError as e:
            self.attachFailed.emit(str(e))
            return False
        self._drop_connecting()
        self.connecting = remote
        remote.setParent(self)
        remote.loadProgress.connect(lambda stage, _f: self.attachProgress.emit(stage))
        remote.loaded.connect(lambda _info: self._on_attached(remote))
        remote.loadFailed.connect(lambda message: self._on_attach_failed(remote, message))
        remote.load()  # a server's host "loads" by connecting: loaded or loadFailed answers
        return True

    def cancel_attach(self) -> None:
        """Stop connecting to a server (attachCancelled); what was in use stays in use."""
        remote = self.connecting
        if remote is None:
            return
        remote.cancel_load()
        self._drop_connecting()
        self.attachCancelled.emit()

    def _drop_connecting(self) -> None:
        remote, self.connecting = self.connecting, None
        if remote is not None:  # whatever its probe still posts reaches nobody
            remote.shutdown(0.0)
            remote.deleteLater()

    def _on_attached(self, remote: Host) -> None:
        if remote is not self.connecting:
            return
        self.connecting = None
        self.detach()
        self.remote, self.attachment = remote, attached(remote)
        self._on_loaded(remote.info)
        self.attachDone.emit(self.attachment)

    def _on_attach_failed(self, remote: Host, message: str) -> None:
        if remote is not self.connecting:
            return
        self._drop_connecting()
        self.attachFailed.emit(message)

    def detach(self) -> None:
        """Back to the local engine (a reply still streaming from the server is cancelled); the chat stays."""
        remote, self.remote, self.attachment = self.remote, None, None
        if remote is None:
            return
        remote.shutdown(1.0)
        for handle in [remote.pending.pop(rid) for rid in list(remote.pending)]:  # none of them reaches it again
            handle.abandon("detached from the server")
        remote.deleteLater()
        if self.host.info is not None:
            self.loaded.emit(self.host.info)
        self.stateChanged.emit()

    # ---- request and host signals --------------------------------------------------------------------------
    def _on_prefill(self, rid: int, progress) -> None:
        if self.requests[rid] is self.active:
            self.prefillArrived.emit(progress)

    def _on_rounds(self, rid: int, events: list[RoundEvent]) -> None:
        req = self.requests[rid]
        req.record.rounds.extend(events)
        if req is self.active:
            self.roundsArrived.emit(events)

    def _on_phase(self, rid: int, event: PhaseEvent) -> None:
        if self.requests[rid] is self.active:
            self.paused = event
            self.phaseArrived.emit(event)
            self.stateChanged.emit()

    def _on_summary(self, rid: int, s: Summary) -> None:
        req = self.requests[rid]
        req.record.summary = s
        if req is self.active:
            self.conversation.append({"role": "assistant", "content": s.text})
            self.replyDone.emit(s)

    def _on_error(self, rid: int, message: str) -> None:
        req = self.requests[rid]
        req.failed = True
        if req is self.active:
            self._keep_partial(req)
            # `death` is set only while the process is gone, when no engine error can arrive: this is the death
            (self.replyInterrupted if self.death is not None else self.replyFailed).emit(message)

    def _keep_partial(self, req: Request) -> None:
        """A reply that ended without a Summary: what did arrive stays in the context."""
        text = "".join(ev.text_delta for ev in req.record.rounds)
        if text:
            self.conversation.append({"role": "assistant", "content": text})
        elif self.conversation and self.conversation[-1]["role"] == "user":
            self.conversation.pop()  # nothing came back: drop the turn from the context, keep it on screen

    def _on_finished(self, rid: int) -> None:
        req = self.requests.pop(rid)
        if req is self.active:
            if req.record.summary is None and not req.failed:  # cancelled before its first round
                self._keep_partial(req)
            self.active = self.paused = None
            self.replyFinished.emit()
        self.stateChanged.emit()

    def _on_died(self, sentence: str) -> None:
        self.death = sentence
        self.engineDied.emit(sentence)
        for req in list(self.requests.values()):
            req.handle.abandon(sentence)
        self.stateChanged.emit()

    def _on_loaded(self, info) -> None:
        self.death = None
        self.loaded.emit(info)
        self.stateChanged.emit()

    def _on_load_failed(self, message: str) -> None:
        self.loadFailed.emit(message)
        self.stateChanged.emit()

    def _on_load_cancelled(self) -> None:
        self.loadCancelled.emit()
        self.stateChanged.emit()
