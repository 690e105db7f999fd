"""Large zero-filled CPU buffers straight from the kernel: pages are zero until first written, and untouched
ones cost no memory.

The packed weights (~1.5 GB for the embedded pair) and the KV caches are the engine's big allocations. The KV
pool is sized for the whole context (4096 tokens: ~330 MB for the embedded pair), and `torch.zeros` writes
every byte of it at load; a chat of a few hundred tokens touches a tenth. The packed matrices come from one
`Arena`, so a model is one mapping.

Transparent huge pages (MADV_HUGEPAGE) were measured and left out: at most ~2% off a decode step, but 1.5-2.5 s
more at load on a machine where the kernel had to compact memory to find the 2 MB pages.
"""
from __future__ import annotations

import mmap

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

    def take(self, nbytes: int) -> torch.Tensor:
        start = -(-self.used // self.ALIGN) * self.ALIGN
        if start + nbytes > self.buffer.numel():
            raise MemoryError(f"arena of {self.buffer.numel()} bytes cannot hand out {nbytes} more after {start}")
        self.used = start + nbytes
        return self.buffer[start : start + nbytes]
