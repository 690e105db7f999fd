"""The round loop's clock: wall time without the time step-through held the engine, so a stepped round times like
any other."""
from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class Clock:
    def __init__(self) -> None:
        self.paused_s = 0.0

    def now(self) -> float:
        return time.perf_counter() - self.paused_s

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Time spent inside is left out of every later reading."""
        t = time.perf_counter()
        try:
            yield
        finally:
            self.paused_s += time.perf_counter() - t
