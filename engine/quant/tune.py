"""Kernel choices made on the machine: where two tiles give the same bits, the one that is faster here.

The AVX-512 kernels can take two 8-column groups per 512-bit register from a few rows on (csrc/kernels_x86.h,
`pair_rows`). On Zen 5 that cut passes of 3-9 tokens by a quarter; Zen 4 runs 512-bit operations as two halves,
and there it made passes of 3-7 tokens 5-15% slower. So the first load on a machine times one Q4_K layer at 3 and
5 rows both ways, alternating, and turns the pairs off only when that takes less time over both by a margin (on a
Zen 4 machine: 3 rows ~20% less, 5 rows 0-7%; over the target's whole stack passes of 3 / 4 / 5 / 7 / 9 tokens took
15 / 10 / 6 / 5 / 0% less). The choice is kept in `<cache>/kernel-tuning.json` under the build's key and the CPU,
so later starts only read it; the cache keeps the latest KEEP choices.
`SPECLENS_PAIR_FROM=<rows>` (0: the default, 17: never) decides instead.
"""
from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

from engine.quant import formats
from engine.quant.cpu import this_cpu

log = logging.getLogger(__name__)

NEVER = 17  # MAX_ROWS + 1: one group per register at every row count
SHAPE = (1536, 8960)  # inputs, outputs: the embedded target's up/gate projection, 8 MB of Q4_K
COPIES = 8  # 64 MB, more than a last-level cache: a pass streams its weights from memory
ROWS = (3, 5)
ROUNDS = 9  # alternating; the fastest of each is kept: another job on the machine only ever slows a call down
MARGIN = 0.97  # pairs go off only when one group per register takes at least 3% less time over the row counts
KEEP = 8  # choices kept in the cache, the latest: builds come and go (an upgrade, another install)


def cpu_id() -> str:
    """The CPU model and the flags the kernels care about: the part of a cached choice's key that names the machine."""
    cpu = this_cpu()
    flags = sorted(f for f in cpu.flags if f.startswith(("avx512", "avx_vnni")))
    return " ".join([cpu.name, cpu.family, cpu.model, *flags])


def time_pairs(mod: ModuleType, rows: tuple[int, ...] = ROWS) -> dict[int, tuple[float, float]]:
    """The fastest seconds of one call at each row count: (pairs as by default, never pairs)."""
    qt, (k, n) = formats.T.Q4_K, SHAPE
    raw = formats.random_rows(qt, n, k, np.random.default_rng(0))
    threads = max(1, torch.get_num_threads())
    packed = [mod.repack(raw, int(qt), n, k, None, threads) for _ in range(COPIES)]
    before = mod.pair_from()
    times: dict[tuple[int, int], list[float]] = {}
    try:
        for r in rows:
            x = torch.randn(r, k)
            for i in range(ROUNDS):
                for setting in ((0, NEVER) if i % 2 == 0 else (NEVER, 0)):
                    mod.set_pair_from(setting)
                    t0 = time.perf_counter()
                    for p in packed:
                        mod.matmul(p, int(qt), n, k, x, None, False, threads)
                    times.setdefault((r, setting), []).append((time.perf_counter() - t0) / COPIES)
    finally:
        mod.set_pair_from(before)
    return {r: (min(times[(r, 0)]), min(times[(r, NEVER)])) for r in rows}


def choose_pair_from(times: dict[int, tuple[float, float]]) -> int:
    """0 (pairs as by default) unless never pairing took less time by the margin, over the row counts timed."""
    paired, never = sum(a for a, _ in times.values()), sum(b for _, b in times.values())
    return NEVER if times and never <= MARGIN * paired else 0


def apply(mod: ModuleType, key: str, cache: Path) -> int:
    """Set this machine's tile choice on mod (an AVX-512 module only), from `cache` when it was decided here for
    this build, else timed now (~0.5 s) and saved; returns it."""
    forced = os.environ.get("SPECLENS_PAIR_FROM")
    if forced is not None:
        mod.set_pair_from(int(forced))
        return int(forced)
    if mod.isa() != "avx512vnni":
        return 0
    entry = f"{key} {cpu_id()}"
    try:
        saved = json.loads(cache.read_text())
    except (OSError, ValueError):
        saved = {}
    if not isinstance(saved, dict):
        saved = {}
    choice = saved.get(entry)
    if not isinstance(choice, int):
        times = time_pairs(mod)
        choice = choose_pair_from(times)
        log.info("kernel tiles: %s", ", ".join(f"{r} rows {a * 1e3:.3f} ms paired, {b * 1e3:.3f} ms not"
                                                for r, (a, b) in times.items()))
        saved.pop(entry, None)
        saved = dict([*list(saved.items())[-(KEEP - 1):], (entry, choice)])  # the oldest builds' choices go
        try:
            cache.parent.mkdir(parents=True, exist_ok=True)
            tmp = cache.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(saved, indent=1))
            tmp.replace(cache)  # whole or not at all, with another process doing the same
        except OSError:
            log.debug("could not save the kernel tile choice", exc_info=True)
    mod.set_pair_from(choice)
    return choice
