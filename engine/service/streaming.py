"""One generate request run in the engine process, its events sent to the window as they come."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from engine.api.events import PhaseEvent, PrefillProgress, RoundEvent, Summary
from engine.api.live import Controls
from engine.api.protocol import (
    Errored,
    Generate,
    PhaseReached,
    Prefilling,
    RequestSummary,
    Rounds,
)
from engine.service.describe import describe_error, log_failure

log = logging.getLogger(__name__)

Send = Callable[[object], None]

BATCH_S = 0.016  # at most ~60 round messages a second: each one wakes the GUI thread
PREFILL_S = 0.1  # at most ~10 prefill messages a second (a chunk of a small model's prompt takes a few ms)


class RoundBatcher:
    """A request's rounds, sent together at most every BATCH_S; flush() sends what waits at once. The one batcher
    of rounds: the engine process's stream() below, and an attached server's stream in the app (app/remote_host.py),
    which posts the same Rounds messages to the window."""

    def __init__(self, rid: int, send: Send) -> None:
        self.rid, self.send = rid, send
        self.waiting: list[RoundEvent] = []
        self.sent = 0.0

    def add(self, event: RoundEvent) -> None:
        self.waiting.append(event)
        now = time.monotonic()
        if now - self.sent >= BATCH_S:
            self.flush()
            self.sent = now

    def flush(self) -> None:
        waiting, self.waiting = self.waiting, []  # emptied first: a message that cannot be built is not retried
        if waiting:
            self.send(Rounds(self.rid, waiting))


class PrefillNews:
    """A request's prefill progress, sent at most every PREFILL_S: always its start and its end, and a new model's
    first word (the draft's catch-up follows the target's reading)."""

    def __init__(self, rid: int, send: Send) -> None:
        self.rid, self.send = rid, send
        self.sent = float("-inf")
        self.model: str | None = None

    def __call__(self, progress: PrefillProgress) -> None:
        now = time.monotonic()
        edge = progress.done in (0, progress.total) or progress.model != self.model
        if edge or now - self.sent >= PREFILL_S:
            self.sent, self.model = now, progress.model
            self.send(Prefilling(self.rid, progress))


def stream(engine: Any, cmd: Generate, controls: Controls, send: Send) -> None:
    """Run the request and send its prefill's progress, its rounds and its phases (step-through), then its summary
    or its error. The caller sends Finished."""
    rounds = RoundBatcher(cmd.rid, send)

    def on_phase(event: PhaseEvent) -> None:  # step-through: the rounds so far go first, then the pause
        rounds.flush()
        send(PhaseReached(cmd.rid, event))

    try:
        if controls.cancelled:  # cancelled while it waited in the queue
            return
        if engine is None:
            raise RuntimeError("no model is loaded yet")
        ids = engine.encode_chat(cmd.messages)
        controls.on_phase = on_phase
        controls.on_prefill = PrefillNews(cmd.rid, send)
        for item in engine.generate(ids, cmd.sampling, cmd.spec, controls):
            if isinstance(item, Summary):
                rounds.flush()
                send(RequestSummary(cmd.rid, item))
            else:
                rounds.add(item)
    except Exception as e:  # noqa: BLE001 - a failed request is a message, never a dead engine
        log_failure(log, "generation failed", e)
        rounds.flush()  # the rounds that did complete still reach the GUI, before the error
        send(Errored(cmd.rid, describe_error(e)))
