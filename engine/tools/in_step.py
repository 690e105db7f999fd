"""Several requests, each on its own engine (Engine.twin), run in turns of a few rounds, so that a benchmark times
every mode in the same seconds.

The development hosts' speed drifts by a third from one minute to the next, and a mode timed over a reply of its own
(a few seconds) lands in whichever minute it lands in: taking turns reply by reply, the default and the same settings
under another name still differed by a few percent a kind in one speclens-bench run. Taking turns a fraction of a
second long, each mode's rounds are spread over the same seconds as every other's, and the drift touches them alike.

The lane that has spent the least time inside its generator so far takes the next turn, so a mode whose rounds are
long does not fall behind in wall time, and a request is timed by the time spent inside its own generator only.

A turn is a run of rounds of at least TURN_S seconds, not a single round: a round right after another engine's round
runs slower than one right after its own (docs/performance.md measures it; glibc's allocator settings move it), and
a user's engine always follows itself. With one round a
turn, modes with short rounds (plain) ran back to back more often than the rest and the schedule flattered them.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from typing import Protocol

from engine.api.events import RoundEvent, Summary

Request = Iterator[RoundEvent | Summary]

# Long enough that the first round of a turn, slowed by the switch, weighs ~1% of the turn; short against the host's
# drift (minutes), so every mode's turns still spread over the same seconds.
TURN_S = 0.25


class Lane(Protocol):
    """One mode's requests on its own engine, one after another (a question's turns)."""

    def request(self) -> Request | None:
        """The next request's generator (Engine.generate), or None when the lane has no more."""

    def finished(self, rounds: list[RoundEvent], summary: Summary) -> None:
        """A request's rounds and Summary (own_time: its total_s the time spent inside its generator)."""


def run_in_step(lanes: Sequence[Lane], around: Callable[[int], AbstractContextManager] | None = None,
                turn_s: float = TURN_S) -> None:
    """Every lane's requests to the end in turns: the lane with the least time spent so far (ties: the earlier lane)
    takes rounds until it has spent turn_s in this turn or its request ends (0: a round a turn). around(i), when
    given, is entered for each of lane i's rounds (a variant's settings)."""
    spent = [0.0] * len(lanes)
    live: dict[int, tuple[Request, list[RoundEvent], list[float]]] = {}
    for i, lane in enumerate(lanes):
        request = lane.request()
        if request is not None:
            live[i] = (request, [], [0.0])
    while live:
        i = min(live, key=lambda j: (spent[j], j))
        request, rounds, seconds = live[i]
        turn = 0.0
        while True:
            with around(i) if around is not None else nullcontext():
                t = time.perf_counter()
                item = next(request)
                dt = time.perf_counter() - t
            turn += dt
            seconds[0] += dt
            if not isinstance(item, RoundEvent):
                break
            rounds.append(item)
            if turn >= turn_s:
                break
        spent[i] += turn
        if isinstance(item, RoundEvent):
            continue
        request.close()  # past its Summary: the engine is free for the lane's next request
        lanes[i].finished(rounds, own_time(item, seconds[0]))
        following = lanes[i].request()
        if following is None:
            del live[i]
        else:
            live[i] = (following, [], [0.0])


def own_time(summary: Summary, seconds: float) -> Summary:
    """The Summary with total_s the request's own seconds and its decode rate taken over them: what the engine left
    out of the rate (the prompt prefills, timed inside one round) stays left out. The engine's clock ran while other
    lanes took their rounds."""
    decode = summary.new_tokens / summary.tokens_per_s if summary.tokens_per_s > 0 else 0.0
    own = seconds - (summary.total_s - decode)
    return replace(summary, total_s=seconds, tokens_per_s=summary.new_tokens / own if own > 0 else 0.0)
