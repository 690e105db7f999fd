"""engine.model.pages: lazily zeroed anonymous buffers and the arena that packed matrices are carved from."""
from __future__ import annotations

import gc
import os
import sys
import threading

import pytest
import torch

from engine.model.pages import HUGE, SMALL, Arena, HugePages, collapse, zeroed, zeros


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


def huge_pages_possible() -> bool:
    """Linux 6.1+ (MADV_COLLAPSE) with transparent huge pages not switched off."""
    if not sys.platform.startswith("linux"):
        return False
    major, minor = (int(v) for v in os.uname().release.split(".")[:2])
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            off = "[never]" in f.read()
    except OSError:
        return False
    return (major, minor) >= (6, 1) and not off


def anon_huge_bytes() -> int:
    with open("/proc/self/smaps_rollup") as f:
        return next(int(ln.split()[1]) for ln in f if ln.startswith("AnonHugePages")) * 1024


def test_collapse_keeps_the_bytes_and_moves_them_onto_huge_pages() -> None:
    t = zeroed(16 * HUGE)
    t.copy_(torch.arange(t.numel(), dtype=torch.int64).remainder(251).to(torch.uint8))  # every page written
    expect = t.clone()
    before = anon_huge_bytes() if sys.platform.startswith("linux") else 0
    done = collapse(t)
    assert torch.equal(t, expect)
    if huge_pages_possible():
        assert done >= 14 * HUGE  # all but the unaligned ends
        assert anon_huge_bytes() - before >= done
    else:
        assert done == 0


def test_huge_pages_run_in_the_background_and_can_be_off(monkeypatch) -> None:
    bufs = [zeroed(4 * HUGE).fill_(1), zeroed(4 * HUGE).fill_(2)]
    hp = HugePages(bufs)
    assert hp.wait(30.0)
    assert (hp.bytes > 0) == huge_pages_possible()
    assert hp.buffers == []  # let go of once done
    monkeypatch.setenv("SPECLENS_HUGE_PAGES", "0")
    off = HugePages([zeroed(4 * HUGE).fill_(3)])
    assert off.thread is None and off.wait(0.0) and off.bytes == 0


def test_a_stopped_collapse_does_nothing_more() -> None:
    stop = threading.Event()
    stop.set()
    t = zeroed(4 * HUGE).fill_(1)
    assert collapse(t, stop) == 0 and int(t.sum()) == 4 * HUGE
