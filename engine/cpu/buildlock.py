"""One kernel build per build folder at a time, across processes, with a lock that cannot outlive its owner.

torch's cpp_extension guards a build with a lock *file* (`<build dir>/lock`, created with O_EXCL) and waits, with no
bound, for it to disappear: a build killed mid-compile (the app closed, kill -9, power loss) leaves it behind and
every later build of the same sources waits forever. Ours is an advisory lock (flock) on `<folder>.lock`: the
operating system drops it when the last process holding it ends, however it ended, so a lock held is a build that
still runs. The file also holds the owner's pid, for the message a waiting process shows.
"""
from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows: msvcrt's byte-range lock, also released when its process ends
    fcntl = None
    import msvcrt

POLL_S = 0.25


class LockTimeout(Exception):
    """Another process held the lock for longer than the caller would wait."""


class BuildLock:
    """An exclusive lock on `path`. `fd` may be handed to a child process (subprocess's pass_fds): the lock then
    stays held until the child ends too, so a build that outlives a killed parent still keeps others waiting for it
    rather than compiling into the same folder beside it."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd: int | None = None

    def try_acquire(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            else:
                msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self.fd = fd
        return True

    def acquire(self, timeout_s: float, waiting: Callable[[float, int | None], None] | None = None,
                cancelled: Callable[[], bool] | None = None) -> None:
        """Take the lock, waiting at most timeout_s (LockTimeout) while another live process holds it; `waiting`
        is called with the seconds waited and the owner's pid about every POLL_S. A cancel raises InterruptedError."""
        t0 = time.monotonic()
        while not self.try_acquire():
            waited = time.monotonic() - t0
            if waited > timeout_s:
                raise LockTimeout(f"another process (pid {self.owner()}) has held {self.path} "
                                  f"for over {timeout_s:.0f} s")
            if cancelled is not None and cancelled():
                raise InterruptedError("cancelled")
            if waiting is not None:
                waiting(waited, self.owner())
            time.sleep(POLL_S)

    def owner(self) -> int | None:
        """The pid the holder wrote (None when unreadable): for messages only, never to decide anything."""
        try:
            return int(self.path.read_text().strip() or "x")
        except (OSError, ValueError):
            return None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)  # the OS drops our hold; a child given the fd keeps its own until it ends
            self.fd = None

    def __enter__(self) -> BuildLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()
