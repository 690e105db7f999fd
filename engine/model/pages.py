"""Large zero-filled CPU buffers straight from the kernel: pages are zero until first written, and untouched
ones cost no memory.

The packed weights (~1.5 GB for the embedded pair) and the KV caches are the engine's big allocations. The KV
pool is sized for the whole context (4096 tokens: ~330 MB for the embedded pair), and `torch.zeros` writes
every byte of it at load; a chat of a few hundred tokens touches a tenth. The packed matrices come from one
`Arena`, so a model is one mapping.

Huge pages: asked for at load (MADV_HUGEPAGE) they cost 1.5-2.5 s more on a machine whose kernel had to compact
memory to find 2 MB pages. `HugePages` instead moves a loaded model's packed matrices onto them in the background
(MADV_COLLAPSE, Linux 6.1+), at the lowest priority: on a Zen 4 machine the target's step was ~10% shorter after.
"""
from __future__ import annotations

import ctypes
import mmap
import os
import sys
import threading

import torch

SMALL = 1 << 20  # below this, the ordinary allocator


def zeroed(nbytes: int) -> torch.Tensor:
    """A (nbytes,) uint8 tensor of zeros; from SMALL up it owns an anonymous mapping of its own."""
    if nbytes < SMALL or not hasattr(mmap, "MAP_ANONYMOUS"):  # Windows: the ordinary allocator
        return torch.zeros(nbytes, dtype=torch.uint8)
    m = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(m, dtype=torch.uint8)  # holds a reference to the mapping


def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """torch.zeros(shape, dtype=dtype) on the CPU, backed by `zeroed`."""
    n = 1
    for s in shape:
        n *= s
    return zeroed(n * torch.empty((), dtype=dtype).element_size()).view(dtype).view(shape)


class Arena:
    """One `zeroed` buffer that many tensors are carved from in turn (e.g. a model's packed matrices).

    Size it generously: address space that is never handed out is never touched, so it costs no memory."""

    ALIGN = 64  # a cache line: every slice starts on one

    def __init__(self, nbytes: int) -> None:
        self.buffer = zeroed(nbytes)
        self.used = 0

    def taken(self) -> torch.Tensor:
        """The part handed out so far."""
        return self.buffer[: self.used]

    def take(self, nbytes: int) -> torch.Tensor:
        start = -(-self.used // self.ALIGN) * self.ALIGN
        if start + nbytes > self.buffer.numel():
            raise MemoryError(f"arena of {self.buffer.numel()} bytes cannot hand out {nbytes} more after {start}")
        self.used = start + nbytes
        return self.buffer[start : start + nbytes]


MADV_COLLAPSE = 25  # Linux 6.1+ (Python's mmap names it only from 3.12)
HUGE = 2 << 20
COLLAPSE_CHUNK = 32 << 20  # one madvise call's share: ~70 ms of kernel time, so a stop is heard soon


def collapse(buf: torch.Tensor, stop: threading.Event | None = None) -> int:
    """Ask Linux to back buf's pages with 2 MB pages now, a chunk at a time; returns the bytes it did. Content and
    addresses stay as they are. 0 where the kernel cannot (not Linux, before 6.1, huge pages off, no memory)."""
    if not sys.platform.startswith("linux") or buf.numel() < HUGE:
        return 0
    libc = ctypes.CDLL(None, use_errno=True)  # a foreign call releases the GIL: the engine runs on meanwhile
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    lo = -(-buf.data_ptr() // HUGE) * HUGE
    hi = (buf.data_ptr() + buf.numel()) // HUGE * HUGE
    done = 0
    for a in range(lo, hi, COLLAPSE_CHUNK):
        if stop is not None and stop.is_set():
            break
        n = min(COLLAPSE_CHUNK, hi - a)
        done += n if libc.madvise(a, n, MADV_COLLAPSE) == 0 else 0
    return done


class HugePages:
    """Collapses buffers onto huge pages in one background thread at the lowest priority (it yields a core to
    decoding); `wait` for benchmarks that must time the steady state. SPECLENS_HUGE_PAGES=0 turns it off."""

    def __init__(self, buffers: list[torch.Tensor]) -> None:
        self.buffers, self.bytes = buffers, 0
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        if buffers and os.environ.get("SPECLENS_HUGE_PAGES", "1") != "0":
            self.thread = threading.Thread(target=self._run, name="speclens-hugepages", daemon=True)
            self.thread.start()

    def _run(self) -> None:
        if hasattr(os, "setpriority"):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # Linux: this thread only
        for buf in self.buffers:
            self.bytes += collapse(buf, self.stop)
        self.buffers = []

    def wait(self, timeout: float = 30.0) -> bool:
        """True when done within timeout seconds."""
        if self.thread is not None:
            self.thread.join(timeout)
        return self.thread is None or not self.thread.is_alive()

    def cancel(self) -> None:
        self.stop.set()
