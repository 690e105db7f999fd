"""Time the quantized linear kernels against fp32 on the layer shapes that matter for the embedded pair.

For each shape (inputs -> outputs), block type and row count R it prints ms per call for the int8-activation
kernel and the exact (fp32-activation) kernel, fp32 F.linear and fp32 oneDNN-prepacked, the memory floor
(packed weight bytes / read bandwidth) and the cost of R rows in units of one row.

The weights are random but valid blocks. Each timing cycles through enough copies of the layer to exceed
the last-level cache, as a real forward pass does (the whole model is ~1 GB), so one layer's time is not
an L3 hit (`--warm` times one copy instead: the kernel's own work, with its weights in cache). Times are the
minimum and median over --reps rounds.

On a machine shared with other jobs, wall-clock times of a 2-thread kernel are dominated by one thread
being descheduled; `--clock cpu` then times one thread by its own CPU time (time.thread_time), which
other jobs barely disturb (they still share the memory bus and caches).

Several instruction sets (`--isa avxvnni,avx512vnni`) are timed on the same build in alternation, round by
round, so a host whose speed drifts moves all of them alike; the int8-activation kernels only, then.

    python -m scripts.bench.kernels [--types Q4_K,Q6_K] [--rows 1,2,5,9,16] [--reps 15] [--clock cpu]
    python -m scripts.bench.kernels --isa avxvnni,avx512vnni --no-fp32
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

from engine.model.pages import collapse
from engine.cpu import ext, formats
from engine.cpu.machine import this_cpu
from engine.tools import results

NOMINAL_GBS = 21.6  # what a one-row matmul reaches on the 2-vCPU EPYC development machine
SHAPES = {"ffn_up 1536->8960": (1536, 8960), "ffn_down 8960->1536": (8960, 1536), "lm_head 1536->151936": (1536, 151936),
          # the draft's (0.5B, run as Q4_0): gate|up in one call, and down
          "draft_up 896->9728": (896, 9728), "draft_down 4864->896": (4864, 896)}
COLD_BYTES = 192 << 20  # cycle through at least this much weight data per round


def cpu_line() -> str:
    return this_cpu().line()


class ReadBandwidth:
    """GB/s of a multi-threaded sum over 512 MB (a stand-in for streaming weights), on huge pages where the kernel
    allows, as the engine's weights are after load (engine.model.pages.HugePages); `once` reads it once."""

    def __init__(self) -> None:
        self.buf = torch.ones(128 << 20)
        collapse(self.buf.view(torch.uint8))

    def once(self) -> float:
        t0 = CLOCK()
        self.buf.sum()
        return self.buf.numel() * 4 / (CLOCK() - t0) / 1e9


def read_bandwidth(threads: int) -> float:
    """The best of five reads (torch's `threads` threads: set by the caller)."""
    reader = ReadBandwidth()
    return max(reader.once() for _ in range(5))


CLOCK = time.perf_counter


def timeit(fn, copies: int, reps: int, setups=(None,)) -> list[tuple[float, float]]:
    """(min, median) ms per call for each setup (called before its round; rounds alternate between setups);
    each round calls fn(i) for every copy i."""
    for i in range(copies):
        fn(i)
    rounds = [[] for _ in setups]
    for _ in range(reps):
        for setup, times in zip(setups, rounds):
            if setup:
                setup()
            t0 = CLOCK()
            for i in range(copies):
                fn(i)
            times.append((CLOCK() - t0) / copies * 1e3)
    return [(min(t), statistics.median(t)) for t in rounds]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", default=",".join(name.split()[0] for name in SHAPES),
                    help="comma-separated, from: " + ", ".join(SHAPES) + " (the first word is enough)")
    ap.add_argument("--types", default="Q4_K,Q6_K,Q8_0,Q5_0")
    ap.add_argument("--rows", default="1,2,5,9,16")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--no-fp32", action="store_true", help="skip the fp32 baselines")
    ap.add_argument("--isa", default=None, help="scalar, avx2, avxvnni or avx512vnni, or several, comma-separated, "
                    "timed in alternation (default: the best this CPU runs)")
    ap.add_argument("--warm", action="store_true",
                    help="one copy of each layer, so its weights stay in cache: what the kernel's work alone costs")
    ap.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                    help="cpu: one thread, timed by its CPU time (for a machine shared with other jobs)")
    results.add_arguments(ap)
    args = ap.parse_args()
    if args.clock == "cpu":
        global CLOCK
        CLOCK, args.threads = time.thread_time, 1
    torch.set_num_threads(args.threads)
    mod = ext.load()
    if mod is None:
        sys.exit("the extension did not build; nothing to time")
    isas = args.isa.split(",") if args.isa else [mod.isa()]
    mod.set_isa(isas[0])
    setups = [lambda isa=isa: mod.set_isa(isa) for isa in isas] if len(isas) > 1 else [None]
    rows = [int(r) for r in args.rows.split(",")]
    bw = read_bandwidth(args.threads)
    print(f"CPU: {cpu_line()}")
    print(f"torch {torch.__version__}, {args.threads} threads, {args.clock} clock, kernels: {', '.join(isas)}, "
          f"measured read bandwidth {bw:.1f} GB/s (floors below use it)")
    rng = np.random.default_rng(0)
    header = f"{'kernel':<26}" + "".join(f"{f'R={r}':>16}" for r in rows)
    by_word = {name.split()[0]: name for name in SHAPES}
    # ms per call by layer, kernel and row count, as printed: {"min": ..., "median": ...}
    figures: dict = {"read_bandwidth_gbs": bw, "threads": args.threads, "clock": args.clock, "isas": isas, "ms": {}}
    for word in args.shapes.split(","):
        name = by_word.get(word.strip().partition(" ")[0])
        if name is None:
            sys.exit(f"unknown shape {word!r}: choose from {', '.join(by_word)}")
        k, n = SHAPES[name]
        layer = figures["ms"].setdefault(name, {})  # (the loops below reuse `name` for their rows' labels)
        xs = {r: torch.randn(r, k) for r in rows}
        print(f"\n== {name}: ms per call, min/median over {args.reps} rounds; (xR) = cost of R rows / 1 row ==")
        print(header)
        for tname in args.types.split(","):
            qt = formats.T[tname]
            if k % formats.fmt(qt).block:  # the draft's 896 inputs take no K-quant blocks of 256
                print(f"{tname}: {k} inputs are not a whole number of its {formats.fmt(qt).block}-input blocks; skipped")
                continue
            raw = formats.random_rows(qt, n, k, rng)
            nbytes = formats.packed_bytes(qt, n, k)
            copies = 1 if args.warm else max(1, -(-COLD_BYTES // nbytes))
            packed = [mod.repack(raw, int(qt), n, k, None, args.threads) for _ in range(copies)]
            floor = nbytes / bw / 1e6
            print(f"{tname} ({formats.fmt(qt).packed_bits_per_weight:.3f} bpw, {nbytes / 1e6:.1f} MB): "
                  f"memory floor {floor:.3f} ms ({nbytes / NOMINAL_GBS / 1e6:.3f} ms at {NOMINAL_GBS} GB/s), "
                  f"{copies} copies")
            modes = [("  int8 activations", False)] + ([("  exact fp32 activations", True)] if len(isas) == 1 else [])
            for label, exact in modes:
                cells, base = {isa: [] for isa in isas}, {}
                for r in rows:
                    timed = timeit(lambda i: mod.matmul(packed[i], int(qt), n, k, xs[r], None, exact, args.threads),
                                   copies, args.reps, setups)
                    for isa, (lo, med) in zip(isas, timed):
                        base.setdefault(isa, lo)  # the first row count's time
                        cells[isa].append(f"{lo:.3f}/{med:.3f} ({lo / base[isa]:.2f}x)")
                        kernel = f"{tname}, {label.strip() if len(isas) == 1 else f'int8, {isa}'}"
                        layer.setdefault(kernel, {})[r] = {"min": lo, "median": med}
                for isa in isas:
                    name = f"  int8, {isa}" if len(isas) > 1 else label
                    print(f"{name:<26}" + "".join(f"{c:>16}" for c in cells[isa]))
            packed = []  # free this type's copies before the next
        if args.no_fp32:
            continue
        w = torch.randn(n, k) * 0.02
        copies = max(1, -(-COLD_BYTES // w.nbytes))
        ws = [w.clone() for _ in range(copies)]
        packed_w = [t.to_mkldnn() for t in ws]
        print(f"fp32 ({w.nbytes / 1e6:.0f} MB): memory floor {w.nbytes / bw / 1e6:.3f} ms, {copies} copies")
        for label, fn in (
            ("  F.linear", lambda i, x: F.linear(x, ws[i])),
            ("  oneDNN prepacked", lambda i, x: torch._C._nn.mkldnn_linear(x.to_mkldnn(), packed_w[i], None).to_dense()),
        ):
            cells, base = [], None
            for r in rows:
                [(lo, med)] = timeit(lambda i: fn(i, xs[r]), copies, max(3, args.reps // 3))
                base = base or lo
                cells.append(f"{lo:.3f}/{med:.3f} ({lo / base:.2f}x)")
                layer.setdefault(f"fp32, {label.strip()}", {})[r] = {"min": lo, "median": med}
            print(f"{label:<26}" + "".join(f"{c:>16}" for c in cells))
        ws, packed_w = [], []
    results.record(args, "scripts.bench.kernels", figures)


if __name__ == "__main__":
    main()
