"""Plain steps inside a speculative chat reply: the basis of the reply's measured speedup.

A speedup is speculative tokens/s over plain tokens/s, and on a machine whose load changes from one minute to the
next the two rates must come from the same minutes. A round that drafts nothing verifies one row: its verify pass is
exactly one plain decoding step. The default drafters draft in every round, so every EVERY rounds the controller
turns speculation off for one round through the reply's live controls (a plain target step; under greedy decoding
it commits the very token speculation would have) and back on once that plain round has arrived; by then the engine
has begun its next round, so a probe is two plain rounds in practice. The charts (app/views/chart_data.py) set the
speculative rounds' wall time against these plain rounds' wall time. No Qt here.
"""
from __future__ import annotations

from engine.api.config import SpecParams
from engine.api.events import RoundEvent


class PlainProbes:
    """When to ask for a plain step in one reply, and which settings to send then.

    `user` is what the controls say; `sent` is what the engine was last told (the user's settings, or them with
    speculation off while a probe is out)."""

    FIRST = 4  # the first probe after the reply's first rounds (the first one carries the draft model's prefill)
    EVERY = 16  # rounds from one probe's plain round to the next probe: ~1/16 of the rounds, a few % of the time

    def __init__(self, spec: SpecParams) -> None:
        self.user = spec
        self.out = False  # a probe was asked for and its plain round has not arrived
        self.next_at = self.FIRST
        self.probes = 0  # plain rounds that arrived while a probe was out

    @property
    def sent(self) -> SpecParams:
        return self.user.with_(enabled=False) if self.out else self.user

    def set_user(self, spec: SpecParams) -> SpecParams:
        """The user changed the controls: what to send now (speculation stays off until an outstanding probe's
        plain round has arrived)."""
        self.user = spec
        return self.sent

    def after(self, events: list[RoundEvent], may_start: bool = True) -> SpecParams | None:
        """Rounds arrived: the settings to send now, or None when nothing changes. may_start False (step-through,
        where every round waits for the user) lets an outstanding probe end but starts none."""
        before = self.out
        for ev in events:
            if ev.stop_reason is not None:
                return None  # the reply is over
            if self.out and ev.mode == "plain":
                self.out = False
                self.probes += 1
                self.next_at = ev.round + self.EVERY
            elif (not self.out and may_start and self.user.enabled and ev.mode == "speculative"
                  and ev.round >= self.next_at):
                self.out = True
        return self.sent if self.out != before else None
