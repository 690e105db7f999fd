"""Several requests, each on its own engine (Engine.twin), run a round at a time in turns, so that a benchmark times
every mode in the same seconds.

The development hosts' speed drifts by a third from one minute to the next, and a mode timed over a reply of its own
(a few seconds) lands in whichever minute it lands in: taking turns reply by reply, the default and the same settings
under another name still differed by 1-5% a kind in one speclens-bench run. Taking turns round by round, each mode's
rounds are spread over the same seconds as every other's, and the drift touches them alike.

The lane that has spent the least time inside its generator so far takes the next round, so a mode whose rounds are
long does not fall behind in wall time, and a request is timed by the time spent inside its own generator only.
"""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import replace
from typing import Protocol

from engine.api.events import RoundEvent, Summary

Request = Iterator[RoundEvent | Summary]


class Lane(Protocol):
    """One mode's requests on its own engine, one after another (a question's turns)."""

    def request(self) -> Request | None:
        """The next request's generator (Engine.generate), or None when the lane has no more."""

    def finished(self, rounds: list[RoundEvent], summary: Summary) -> None:
        """A request's rounds and Summary (own_time: its total_s the time spent inside its generator)."""


def run_in_step(lanes: Sequence[Lane], around: Callable[[int], AbstractContextManager] | None = None) -> None:
    """Every lane's requests to the end, a round at a time, the lane with the least time spent so far first (ties:
    the earlier lane). around(i), when given, is entered for each of lane i's rounds (a variant's settings)."""
    spent = [0.0] * len(lanes)
    live: dict[int, tuple[Request, list[RoundEvent], list[float]]] = {}
    for i, lane in enumerate(lanes):
        request = lane.request()
        if request is not None:
            live[i] = (request, [], [0.0])
    while live:
        i = min(live, key=lambda j: (spent[j], j))
        request, rounds, seconds = live[i]
        with around(i) if around is not None else nullcontext():
            t = time.perf_counter()
            item = next(request)
            dt = time.perf_counter() - t
        spent[i] += dt
        seconds[0] += dt
        if isinstance(item, RoundEvent):
            rounds.append(item)
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
