"""How many threads the CPU kernels run: no more than the cores other programs leave free.

Every matmul is split across the threads, which meet at its end (engine/cpu/csrc: an OpenMP loop per layer), so a
thread the scheduler preempts for another program stalls the others until it runs again. With one core of two busy,
two threads wait at every barrier for the one that shares its core, and a step takes several times what one thread
alone on the free core takes (docs/performance.md has the figures). So between rounds the engine reads how much CPU
time the rest of the machine took (Linux's /proc/stat, less this process's own) and runs on the cores left free.

Each thread computes whole output groups in a fixed order, and the torch operations between the kernels compute
each element alike at any thread count, so the numbers, and therefore greedy output and a seeded sample, are the
same whatever count runs (tests/engine/test_threads.py checks both on the embedded pair).

Off Linux (no /proc/stat) nothing is measured and the thread count stays as the process set it.
"""
from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

import torch

WINDOW_S = 0.5  # seconds of CPU accounting per decision: a few rounds, long enough for 10-ms ticks to add up
# Cores another program must hold before a thread gives its core up: a window repainting (a few % of a core) or a
# short burst stays under it, a busy process (one core) is well over it.
BUSY_CORE = 0.6
AGREE = 2  # windows in a row that must call for the same count before it changes: one burst moves nothing


def allowed_cpus() -> list[int] | None:
    """The CPUs this process may run on (its affinity: a container's or taskset's share of a larger machine), or None
    where the OS does not say."""
    try:
        return sorted(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def read_busy_s(cpus: Collection[int] | None = None, path: str = "/proc/stat") -> float | None:
    """Seconds the CPUs `cpus` (every CPU when None) have spent working since boot (user, nice, system, irq,
    softirq), or None where the OS does not keep /proc/stat or lists one of them nowhere. Idle, I/O wait and the time
    a hypervisor stole are not work done here. Only the CPUs this process may use count: on a larger machine the
    other CPUs' work takes no core from it."""
    try:
        with open(path, encoding="ascii") as f:
            lines = f.read(1 << 20).splitlines()
    except OSError:
        return None
    wanted = {"cpu"} if cpus is None else {f"cpu{n}" for n in cpus}
    total, seen = 0, set()
    for line in lines:
        fields = line.split()
        if not fields or fields[0] not in wanted or len(fields) < 8:
            continue
        try:
            user, nice, system, _idle, _iowait, irq, softirq = (int(x) for x in fields[1:8])
        except ValueError:
            return None
        total += user + nice + system + irq + softirq
        seen.add(fields[0])
    if seen != wanted:
        return None
    return total / os.sysconf("SC_CLK_TCK")


def read_own_s() -> float:
    """Seconds of CPU this process has used, all its threads."""
    t = os.times()
    return t.user + t.system


@dataclass
class Sample:
    wall_s: float
    busy_s: float
    own_s: float


class ThreadGovernor:
    """Between rounds, `update()` sets the kernels' thread count to the cores other programs leave free, at most
    the `ceiling` the process had set when the request began (`begin()`), at least one; `end()` gives the process
    its own setting back. `others` is the last window's measure: cores the rest of the machine kept busy."""

    def __init__(self, cores: int | None = None, read_busy: Callable[[], float | None] | None = None,
                 read_own: Callable[[], float] = read_own_s, clock: Callable[[], float] = time.monotonic,
                 apply: Callable[[int], None] = torch.set_num_threads,
                 current: Callable[[], int] = torch.get_num_threads) -> None:
        cpus = allowed_cpus()  # by default: the CPUs this process may use, and only their work
        self.cores = cores or (len(cpus) if cpus else os.cpu_count() or 1)
        self._read_busy = read_busy or (lambda: read_busy_s(cpus))
        self._read_own, self._clock, self._apply, self._current = read_own, clock, apply, current
        self.ceiling = max(1, current())
        self.threads = self.ceiling  # the count in force
        self.others: float | None = None
        self._want: list[int] = []  # the counts the last windows called for, newest last
        self._last: Sample | None = None
        self._active = False

    @classmethod
    def fixed(cls) -> ThreadGovernor:
        """One that measures nothing: the count stays as the process set it (a GPU's engine, or a benchmark's
        fixed side)."""
        return cls(1, read_busy=lambda: None)

    def _sample(self, now: float) -> Sample | None:
        busy = self._read_busy()
        return None if busy is None else Sample(now, busy, self._read_own())

    def begin(self) -> None:
        """A request starts: the process's own setting is the ceiling, and the time since the last request, when it
        is long enough to be no burst, decides the count at once; otherwise the count the last windows settled on
        holds until the next ones say otherwise."""
        self.ceiling = max(1, self._current())
        self._active = True
        self._set(min(self.threads, self.ceiling) if self.others is not None else self.ceiling)
        self.update()

    def end(self) -> None:
        """The request is over: the process's setting again, for whatever runs between requests."""
        if self._active:
            self._active = False
            self._apply(self.ceiling)

    def update(self) -> int:
        """Called between rounds; measures once every WINDOW_S and returns the count in force."""
        now = self._clock()
        if self._last is None:
            self._last = self._sample(now)
            return self.threads
        if now - self._last.wall_s < WINDOW_S:
            return self.threads
        s = self._sample(now)
        if s is None:
            return self.threads
        wall = s.wall_s - self._last.wall_s
        self.others = max(0.0, (s.busy_s - self._last.busy_s) - (s.own_s - self._last.own_s)) / wall
        self._last = s
        want = free_threads(self.cores, self.others, self.ceiling)
        # A window as long as AGREE of them (the time between two requests) is no burst: it decides alone.
        self._want = [want] * AGREE if wall >= AGREE * WINDOW_S else (self._want + [want])[-AGREE:]
        if len(self._want) == AGREE and len(set(self._want)) == 1 and want != self.threads:
            self._set(want)
        return self.threads

    def _set(self, n: int) -> None:
        self.threads = n
        if self._current() != n:
            self._apply(n)


def free_threads(cores: int, others: float, ceiling: int) -> int:
    """Threads for the cores `others` (busy cores of other programs) leave free: a core counts as taken once another
    program holds BUSY_CORE of it. At least 1, at most ceiling."""
    taken = math.floor(others + (1 - BUSY_CORE))
    return max(1, min(ceiling, cores - taken))
