"""Kernel choices made on the machine: where two ways give the same bits, the one that is faster here.

Pairs (AVX-512 only). The AVX-512 kernels can take two 8-column groups per 512-bit register from a few rows on
(csrc/kernels_x86.h, `pair_rows`). On Zen 5 that cut passes of 3-9 tokens by a quarter; Zen 4 runs 512-bit operations
as two halves, and there it made passes of 3-7 tokens 5-15% slower. So the first load on a machine times one Q4_K
layer at 3 and 5 rows both ways, alternating, and turns the pairs off only when that takes less time over both by a
margin (on a Zen 4 machine: 3 rows ~20% less, 5 rows 0-7%; over the target's whole stack passes of 3 / 4 / 5 / 7 / 9
tokens took 15 / 10 / 6 / 5 / 0% less).

The stream prefetch (every x86 build). Over 1-6 rows each thread streams one run of weights, which the kernels leave
to the hardware prefetcher (`g_stream_prefetch`). On Zen 4, asking for each unit 6 KB ahead made a draft step 5%
slower in the host's fast-memory minutes (the same in its slow ones) and passes of 2-5 tokens up to 22% slower; on Zen 3
one-row calls have run faster with it (docs/performance.md). So the first load also times a
one-row Q4_0 layer (the draft's gate|up) and a Q4_K layer over 1 and 5 rows both ways, and asks ahead only where that
takes less time by the margin.

The choices are kept in `<cache>/kernel-tuning.json` under the build's key and the CPU, so later starts only read
them; the cache keeps the latest KEEP. `SPECLENS_PAIR_FROM=<rows>` (0: the default, 17: never) and
`SPECLENS_STREAM_PREFETCH=0|1` decide instead (nothing is then saved).
"""
from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
import torch

from engine.cpu import formats
from engine.cpu.machine import this_cpu

log = logging.getLogger(__name__)

NEVER = 17  # MAX_ROWS + 1: one group per register at every row count
SHAPE = (1536, 8960)  # inputs, outputs: the embedded target's up/gate projection, 8 MB of Q4_K
DRAFT_SHAPE = (896, 9728)  # the embedded draft's gate|up, 4.9 MB of Q4_0
STREAM_CASES = ((formats.T.Q4_0, DRAFT_SHAPE, 1), (formats.T.Q4_K, SHAPE, 1), (formats.T.Q4_K, SHAPE, 5))
COLD_BYTES = 64 << 20  # copies of a layer past a last-level cache: a call streams its weights from memory
ROWS = (3, 5)
ROUNDS = 9  # alternating; the fastest of each is kept: another job on the machine only ever slows a call down
MARGIN = 0.97  # the other way is taken only when it takes at least 3% less time over the cases timed
KEEP = 8  # choices kept in the cache, the latest: builds come and go (an upgrade, another install)
FIELDS = ("pair_from", "stream_prefetch")
ENV = {"pair_from": "SPECLENS_PAIR_FROM", "stream_prefetch": "SPECLENS_STREAM_PREFETCH"}


@dataclass(frozen=True)
class Tiles:
    """This machine's kernel choices (each gives the same bits as its default)."""

    pair_from: int = 0  # 0: pairs from each block type's default row count; NEVER: one group per register
    stream_prefetch: int = 0  # 1: calls over 1-6 rows ask for their weights 6 KB ahead


def cpu_id() -> str:
    """The CPU model and the flags the kernels care about: the part of a cached choice's key that names the machine."""
    cpu = this_cpu()
    flags = sorted(f for f in cpu.flags if f.startswith(("avx512", "avx_vnni")))
    return " ".join([cpu.name, cpu.family, cpu.model, *flags])


def _cold_copies(mod: ModuleType, qt: formats.T, k: int, n: int) -> list[torch.Tensor]:
    """Copies of one random (k -> n) layer past COLD_BYTES, so that a call streams its weights from memory."""
    raw = formats.random_rows(qt, n, k, np.random.default_rng(0))
    copies = max(2, -(-COLD_BYTES // formats.packed_bytes(qt, n, k)))
    return [mod.repack(raw, int(qt), n, k, None, max(1, torch.get_num_threads())) for _ in range(copies)]


def _time_both(mod: ModuleType, setting: str, ways: tuple[int, int],
               cases: list[tuple[formats.T, tuple[int, int], int, list[torch.Tensor]]]) -> list[tuple[float, float]]:
    """The fastest seconds of one call in each case under each of two ways of mod's `setting` (pair_from,
    stream_prefetch), alternating round by round; the setting found is restored."""
    get, set_ = getattr(mod, setting), getattr(mod, f"set_{setting}")
    threads = max(1, torch.get_num_threads())
    times: dict[tuple[int, int], list[float]] = {}
    before = get()
    try:
        for c, (qt, (k, n), rows, packed) in enumerate(cases):
            x = torch.randn(rows, k)
            for i in range(ROUNDS):
                for way in (ways if i % 2 == 0 else ways[::-1]):
                    set_(way)
                    t0 = time.perf_counter()
                    for p in packed:
                        mod.matmul(p, int(qt), n, k, x, None, False, threads)
                    times.setdefault((c, way), []).append((time.perf_counter() - t0) / len(packed))
    finally:
        set_(before)
    return [(min(times[(c, ways[0])]), min(times[(c, ways[1])])) for c in range(len(cases))]


def time_pairs(mod: ModuleType, rows: tuple[int, ...] = ROWS) -> dict[int, tuple[float, float]]:
    """The fastest seconds of one call at each row count: (pairs as by default, never pairs)."""
    qt, (k, n) = formats.T.Q4_K, SHAPE
    packed = _cold_copies(mod, qt, k, n)
    return dict(zip(rows, _time_both(mod, "pair_from", (0, NEVER), [(qt, (k, n), r, packed) for r in rows])))


def time_stream_prefetch(mod: ModuleType) -> dict[str, tuple[float, float]]:
    """The fastest seconds of one call in each of STREAM_CASES: (left to the hardware, asked 6 KB ahead)."""
    packed = {(qt, shape): _cold_copies(mod, qt, *shape) for qt, shape, _ in STREAM_CASES}
    times = _time_both(mod, "stream_prefetch", (0, 1),
                       [(qt, shape, rows, packed[(qt, shape)]) for qt, shape, rows in STREAM_CASES])
    return {f"{qt.name} {shape[0]}->{shape[1]}, {rows} row(s)": t for (qt, shape, rows), t in zip(STREAM_CASES, times)}


def _other_way_wins(times: Iterable[tuple[float, float]]) -> bool:
    """Whether the second way took less time than the first by the margin, over all the cases."""
    times = list(times)
    return bool(times) and sum(b for _, b in times) <= MARGIN * sum(a for a, _ in times)


def choose_pair_from(times: dict[int, tuple[float, float]]) -> int:
    """0 (pairs as by default) unless never pairing took less time by the margin, over the row counts timed."""
    return NEVER if _other_way_wins(times.values()) else 0


def choose_stream_prefetch(times: dict[str, tuple[float, float]]) -> int:
    """0 (the hardware prefetcher alone) unless asking ahead took less time by the margin, over the cases timed."""
    return 1 if _other_way_wins(times.values()) else 0


def _decide(mod: ModuleType, field: str) -> int:
    if field == "pair_from":
        times: dict = time_pairs(mod)
        choice = choose_pair_from(times)
    else:
        times = time_stream_prefetch(mod)
        choice = choose_stream_prefetch(times)
    said = ", ".join(f"{c}: {a * 1e3:.3f} / {b * 1e3:.3f} ms" for c, (a, b) in times.items())
    log.info("kernel %s: %s -> %d", field, said, choice)
    return choice


def applicable(mod: ModuleType) -> tuple[str, ...]:
    """The choices this module's instruction set has: pairs on AVX-512, the stream prefetch on every x86 build."""
    isa = mod.isa()
    return tuple(f for f in FIELDS if (f == "pair_from" and isa == "avx512vnni")
                 or (f == "stream_prefetch" and isa != "scalar"))


def _read(cache: Path) -> dict:
    try:
        saved = json.loads(cache.read_text())
    except (OSError, ValueError):
        return {}
    return saved if isinstance(saved, dict) else {}


def _save(cache: Path, saved: dict, entry: str, choices: dict[str, int]) -> None:
    saved.pop(entry, None)
    saved = dict([*list(saved.items())[-(KEEP - 1):], (entry, choices)])  # the oldest builds' choices go
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(saved, indent=1))
        tmp.replace(cache)  # whole or not at all, with another process doing the same
    except OSError:
        log.debug("could not save the kernel choices", exc_info=True)


def apply(mod: ModuleType, key: str, cache: Path) -> Tiles:
    """Set this machine's kernel choices on mod, from `cache` when they were decided here for this build, else timed
    now (~0.5 s) and saved; an environment variable of ENV decides its choice instead. Returns them."""
    forced = {f: int(os.environ[ENV[f]]) for f in FIELDS if os.environ.get(ENV[f]) is not None}
    wanted = [f for f in applicable(mod) if f not in forced]
    decided: dict[str, int] = {}
    if wanted:
        entry = f"{key} {cpu_id()}"
        saved = _read(cache)
        cached = saved.get(entry)
        if isinstance(cached, dict) and all(isinstance(cached.get(f), int) for f in wanted):
            decided = {f: cached[f] for f in wanted}
        else:
            decided = {f: _decide(mod, f) for f in wanted}
            if not forced:
                _save(cache, saved, entry, decided)
    tiles = Tiles(**{**decided, **forced})
    mod.set_pair_from(tiles.pair_from)
    mod.set_stream_prefetch(tiles.stream_prefetch)
    return tiles
