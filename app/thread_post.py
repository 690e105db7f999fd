"""A worker thread's one way to the GUI thread that its owner can shut before the QObject behind it is deleted.

A worker thread (a host's reader, a server probe, a stream) reaches the GUI thread by emitting a queued signal of
a QObject that lives in the GUI thread. That QObject can be deleted (deleteLater, its parent going) while the
thread still runs: an emit racing the deletion reads a half-destroyed C++ object and takes the whole process down
(a segmentation fault, not a RuntimeError that a `try` could catch). So every emit goes through `post`, under a
lock, and the owner calls `close()` on the GUI thread before it lets the object go: close waits for an emit in
flight (a queued emit only posts an event: microseconds), and after it no thread touches the object again.

An owner that may be deleted without being told first (a parent going) also connects its `destroyed` signal to
`close`: Qt emits it before the object's memory is freed, and an emit that races it sees a deleted wrapper, which
raises RuntimeError; `post` takes that as closed. A gate `within` another (an engine process's reader within its
host) is open while both are.
"""
from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class ThreadPost:
    def __init__(self, within: ThreadPost | None = None) -> None:
        self._lock = threading.Lock()
        self._open = True
        self._within = within

    def post(self, emit: Callable[..., Any], *args: Any) -> bool:
        """Worker thread: emit(*args) unless closed; False (and nothing touched) once closed."""
        with self._lock:
            if not self._open:
                return False
            if self._within is not None:
                return self._within.post(emit, *args)
            try:
                emit(*args)
            except RuntimeError:  # the object was deleted before anyone closed this: nobody is left to tell
                self._open = False
                return False
            return True

    def close(self) -> None:
        """GUI thread: from now on `post` touches nothing; returns once an emit in flight has ended."""
        with self._lock:
            self._open = False

    @property
    def closed(self) -> bool:
        with self._lock:
            return not self._open or (self._within is not None and self._within.closed)
