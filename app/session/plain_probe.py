"""Plain steps inside a speculative chat reply: the basis of the reply's measured speedup.

A speedup is speculative tokens/s over plain tokens/s, and on a machine whose load changes from one minute to the
next the two rates must come from the same minutes. A round that drafts nothing verifies one row: its verify pass is
exactly one plain decoding step. The default drafters draft in every round, so every EVERY rounds the controller asks
the engine for one plain round (engine.api.protocol.PlainRound: under greedy decoding it commits the very token
speculation would have), and the engine goes back to the reply's settings by itself. A probe is thus exactly one
round, and the window's own work on it (painting, the next request) falls in the speculative rounds after it, as for
every round: when the window turned speculation off and on again through the live controls, a probe was two plain
rounds, and the second ran while the window handled the first (on a 2-core machine under load those second steps
took twice the first ones, and the basis with them). The charts (app/views/chart_data.py) set the speculative rounds'
wall time against these plain rounds' wall time. No Qt here.
"""
from __future__ import annotations

from engine.api.config import SpecParams
from engine.api.events import RoundEvent


class PlainProbes:
    """When to ask one chat reply for a plain step. `user` is what the controls say."""

    FIRST = 4  # the first probe after the reply's first rounds (the first one carries the draft model's prefill)
    EVERY = 16  # rounds from one probe's plain round to the next probe: ~1/16 of the rounds, a few % of the time

    def __init__(self, spec: SpecParams) -> None:
        self.user = spec
        self.out = False  # a plain step was asked for and has not arrived
        self.next_at = self.FIRST
        self.probes = 0  # plain rounds that arrived while a probe was out

    def set_user(self, spec: SpecParams) -> None:
        """The user changed the controls (speculation off: no probe is asked for until it is back on)."""
        self.user = spec

    def after(self, events: list[RoundEvent], may_start: bool = True) -> bool:
        """Rounds arrived: True when a plain step should be asked for now. may_start False (step-through, where
        every round waits for the user) lets an outstanding probe end but asks for none."""
        ask = False
        for ev in events:
            if ev.stop_reason is not None:
                return False  # the reply is over
            if self.out and ev.mode == "plain":
                self.out = False
                self.probes += 1
                self.next_at = ev.round + self.EVERY
            elif (not self.out and may_start and self.user.enabled and ev.mode == "speculative"
                  and ev.round >= self.next_at):
                self.out = ask = True
        return ask
