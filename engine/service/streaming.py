"""One generate request run in the engine process, its events sent to the window as they come."""
from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from engine.api.events import PhaseEvent, RoundEvent, Summary
from engine.api.live import Controls
from engine.api.protocol import Errored, Generate, PhaseReached, RequestSummary, Rounds
from engine.service.describe import describe_error, log_failure

log = logging.getLogger(__name__)

Send = Callable[[object], None]

BATCH_S = 0.016  # at most ~60 round messages a second: each one wakes the GUI thread


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


def stream(engine: Any, cmd: Generate, controls: Controls, send: Send) -> None:
    """Run the request and send its rounds and its phases (step-through), then its summary or its error. The
    caller sends Finished."""
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
