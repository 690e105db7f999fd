"""engine.model.pages: lazily zeroed anonymous buffers and the arena that packed matrices are carved from."""
from __future__ import annotations

import gc
import os
import sys

import pytest
import torch

from engine.model.pages import SMALL, Arena, zeroed, zeros


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.parametrize("n", [1, 4095, SMALL - 1, SMALL, 3 * SMALL + 7])
def test_zeroed_is_zero_and_writable(n: int) -> None:
    t = zeroed(n)
    assert t.shape == (n,) and t.dtype == torch.uint8
    assert int(t.count_nonzero()) == 0
    t.fill_(7)
    assert int(t.sum()) == 7 * n


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_untouched_pages_cost_no_memory() -> None:
    before = rss_bytes()
    t = zeroed(512 << 20)
    assert rss_bytes() - before < 64 << 20  # address space only
    t[: 8 << 20].fill_(1)  # touch 8 MB
    assert rss_bytes() - before < 128 << 20
    assert int(t[: 8 << 20].sum()) == 8 << 20


def test_tensor_keeps_its_mapping_alive() -> None:
    t = zeroed(SMALL * 2)
    gc.collect()  # the mmap object is referenced by the tensor alone
    t[-1] = 5
    assert int(t[-1]) == 5 and int(t[:-1].count_nonzero()) == 0


def test_zeros_shape_and_dtype() -> None:
    z = zeros((3, 1024, 2, 64), torch.float32)
    assert z.shape == (3, 1024, 2, 64) and z.dtype == torch.float32 and z.is_contiguous()
    assert torch.equal(z, torch.zeros_like(z))
    z[1, 5] = 2.5
    assert float(z.sum()) == 2.5 * 2 * 64


def test_arena_hands_out_aligned_disjoint_slices() -> None:
    arena = Arena(10_000)
    a, b, c = arena.take(100), arena.take(1), arena.take(3000)
    starts = [x.data_ptr() - arena.buffer.data_ptr() for x in (a, b, c)]
    assert starts == [0, 128, 192]  # each on a 64-byte line, in order
    a.fill_(1), b.fill_(2), c.fill_(3)
    assert int(arena.buffer.sum()) == 100 + 2 + 9000
    with pytest.raises(MemoryError, match="cannot hand out"):
        arena.take(10_000)
