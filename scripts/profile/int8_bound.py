"""How fast the AVX2 kernels' integer dot can possibly go on this CPU, and what that allows a multi-token pass.

The kernels' Q4_K tile does, per row and per block of 8 columns x 32 inputs: 8 broadcasts of 4 activations,
8 `vpmaddubsw`, 7 int16 adds, a `vpmaddwd` by the block's scales, a conversion to float and an FMA by the row's
block scale (kernels_x86.h; the order the bits depend on). This times exactly that sequence in inline assembly with
every operand in registers (no weight decoding, no loads but the activations', no spills), over 4 independent rows:
an upper bound on the tile's speed. The decoding of the weights, the Q4_K mins and everything outside the tile
come on top.

Beside it, the real tile: the extension's int8 kernel over one Q4_K layer (1536 -> 8960, 8 MB: in L3, not in L2) on
one thread, for 1-9 rows in alternation, the least time of each. What each row beyond the first adds (the slope of a
line through rows 2-9) is the tile's own per-row cost; against the sequence above it says how much of the row loop
is not integer dot. One row's time also holds the work done once per weight block (its decoding), which more rows
share. The real tile runs the AVX2 kernels whatever the CPU's best, so that both sides are AVX2 code.

From it: the least time a pass of R tokens can take over the target's matrices (all of them counted at the
Q4_K block's cost, though Q6_K's costs more), on the given threads, against the step's memory floor (the packed
weights a step reads over the read bandwidth measured here, as scripts/profile/step.py). The pass goals ask a pass of
5 tokens for <= 1.25 steps and of 9 for <= 1.6.

    python -m scripts.profile.int8_bound [--threads 2] [--gguf TARGET.gguf]
"""
from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from engine.io.gguf_file import GGUFFile
from engine.io.provision import default_pair
from engine.cpu import ext, formats
from engine.tools import results
from scripts.bench.kernels import cpu_line, read_bandwidth

ROUNDS = 9  # turns of the sequence and the real tile
SEQ_TRIES = 9  # the sequence's timings in a turn, the best kept
TILE_REPS = 5  # the real tile's rounds over all row counts in a turn, the least of each kept
ROWS = 4  # independent rows in flight: 8 weight + 4 accumulator + scale + 2 scratch registers of 16


def row_asm(r: int) -> list[str]:
    """One row-block of row r: the tile's instruction sequence, weights in ymm0-7, the scale pairs in ymm8."""
    a = 32 * r
    out = [f"vpbroadcastd {a}(%0), %%ymm14", "vpmaddubsw %%ymm14, %%ymm0, %%ymm15"]
    for s in range(1, 8):
        out += [f"vpbroadcastd {a + 4 * s}(%0), %%ymm14", f"vpmaddubsw %%ymm14, %%ymm{s}, %%ymm14",
                "vpaddw %%ymm14, %%ymm15, %%ymm15"]
    return out + ["vpmaddwd %%ymm8, %%ymm15, %%ymm15", "vcvtdq2ps %%ymm15, %%ymm15",
                  f"vbroadcastss {4 * r}(%1), %%ymm14", f"vfmadd231ps %%ymm14, %%ymm15, %%ymm{9 + r}"]


SOURCE = r"""
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
alignas(64) int8_t act[4096];
alignas(64) float dx[64];
__attribute__((noinline)) double run(long n) {
    auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < n; ++i)
        asm volatile(BODY :: "r"(act), "r"(dx) : "xmm9", "xmm10", "xmm11", "xmm12", "xmm14", "xmm15", "memory");
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
}
int main(int argc, char** argv) {
    const long n = 1000000;
    double best = 1e30;
    for (int k = 0; k < std::atoi(argv[1]); ++k) best = std::min(best, run(n) / n / ROWS);
    std::printf("%.4f\n", best);
}
"""


def build_sequence(folder: Path) -> Path:
    """The sequence's timing program, compiled into folder: `prog N` prints the best of N timings, ns per row-block
    per row, on one core."""
    body = "".join(f'"{line}\\n"\n' for r in range(ROWS) for line in row_asm(r))
    src, exe = folder / "bound.cpp", folder / "bound"
    src.write_text(SOURCE.replace("BODY", body).replace("ROWS", str(ROWS)))
    subprocess.run([shutil.which("g++") or "g++", "-O2", "-mavx2", "-mfma", "-o", str(exe), str(src)], check=True)
    return exe


def sequence_ns(exe: Path, tries: int) -> float:
    return float(subprocess.run([str(exe), str(tries)], check=True, capture_output=True, text=True).stdout)


class RealTile:
    """The extension's int8 kernel over one Q4_K layer, 1536 -> 8960 (8 MB: in L3, not in L2), on one thread."""

    K, N = 1536, 8960
    ROW_BLOCKS = K * N // 256

    def __init__(self, mod, max_rows: int = 9) -> None:
        self.mod, self.qt = mod, int(formats.T.Q4_K)
        raw = formats.random_rows(self.qt, self.N, self.K, np.random.default_rng(0))
        self.packed = mod.repack(raw, self.qt, self.N, self.K, None, 1)
        self.xs = {r: torch.randn(r, self.K) for r in range(1, max_rows + 1)}

    def rows_ms(self, reps: int) -> dict[int, float]:
        """Least ms per row count; the counts take turns, round by round, so a drift of the host's speed moves all
        of them alike."""
        best = {r: float("inf") for r in self.xs}
        for _ in range(reps):
            for r, x in self.xs.items():
                t0 = time.perf_counter()
                self.mod.matmul(self.packed, self.qt, self.N, self.K, x, None, False, 1)
                best[r] = min(best[r], (time.perf_counter() - t0) * 1e3)
        return best

    def per_row_ns(self, rows_ms: dict[int, float]) -> float:
        """What each row beyond the first adds, ns per row-block: the least-squares slope through rows 2 and up."""
        pts = [(r, ms) for r, ms in rows_ms.items() if r >= 2]
        fit = statistics.linear_regression([r for r, _ in pts], [ms for _, ms in pts])
        return fit.slope * 1e6 / self.ROW_BLOCKS


def step_matrices(path: Path) -> tuple[int, int]:
    """Row-blocks (8 columns x 32 inputs) and bytes of the matrices a step reads: the layers' and the LM head."""
    g = GGUFFile(path, check_data=False)
    head = "output.weight" if "output.weight" in g.tensors else "token_embd.weight"
    mats = [t for n, t in g.tensors.items() if len(t.shape) == 2 and (n.startswith("blk.") or n == head)]
    return sum(t.numel for t in mats) // 256, sum(t.nbytes for t in mats)


def turns(tile: RealTile | None) -> tuple[list[float], list[float], dict[int, float]]:
    """The sequence's ns and the real tile's per-row ns, timed in turns: on a host whose speed drifts between
    minutes, only the two taken in the same turn compare. Also the last turn's times per row count."""
    seq, real, rows_ms = [], [], {}
    with tempfile.TemporaryDirectory() as d:
        exe = build_sequence(Path(d))
        for _ in range(ROUNDS):
            seq.append(sequence_ns(exe, SEQ_TRIES))
            if tile is not None:
                rows_ms = tile.rows_ms(TILE_REPS)
                real.append(tile.per_row_ns(rows_ms))
    return seq, real, rows_ms


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gguf", help="the target GGUF (default: the embedded pair's)")
    results.add_arguments(ap)
    a = ap.parse_args()
    path = Path(a.gguf) if a.gguf else default_pair()[0]
    blocks, nbytes = step_matrices(path)
    mod = ext.load()
    avx2 = mod is not None and "avx2" in mod.supported_isas()
    if avx2:
        mod.set_isa("avx2")
    seq, real, rows_ms = turns(RealTile(mod) if avx2 else None)
    ns = statistics.median(seq)
    gbs = read_bandwidth(a.threads)
    floor_ms = nbytes / gbs / 1e6
    print(cpu_line())
    print(f"the AVX2 tile's integer dot, operands in registers: {ns:.3f} ns per row-block per row (one core; the "
          f"median of {ROUNDS} turns, each the best of {SEQ_TRIES}; range {min(seq):.3f}-{max(seq):.3f})")
    tile_ns = None
    if real:
        tile_ns = statistics.median(real)
        ratios = [r / s for r, s in zip(real, seq)]
        print(f"the real Q4_K tile (AVX2 kernels; {RealTile.K} -> {RealTile.N} in L3, one thread): each row beyond "
              f"the first adds {tile_ns:.3f} ns per row-block (range {min(real):.3f}-{max(real):.3f}), "
              f"{statistics.median(ratios):.2f}x the sequence in the same turn "
              f"(range {min(ratios):.2f}-{max(ratios):.2f})")
        times = ", ".join(f"{r}: {ms:.3f}" for r, ms in rows_ms.items())
        print(f"  its last turn, least ms of {TILE_REPS} per row count: {times}")
    print(f"{path.name}: {blocks / 1e6:.2f} M row-blocks a row; a step reads {nbytes / 1e6:.0f} MB, at {gbs:.1f} GB/s "
          f"a floor of {floor_ms:.1f} ms")
    figures: dict = {"model": path.name, "threads": a.threads, "dot_ns_per_row_block": ns, "tile_ns_per_row_block":
                     tile_ns, "row_blocks_a_row": blocks, "step_mb": nbytes / 1e6, "read_gbs": gbs,
                     "floor_ms": floor_ms, "passes": {}}
    for rows, goal in ((5, 1.25), (9, 1.6)):
        ms = rows * blocks * ns / a.threads / 1e6
        figures["passes"][rows] = {"goal_steps": goal, "dots_ms": ms, "floor_steps": ms / floor_ms}
        print(f"pass of {rows} tokens on {a.threads} threads: >= {ms:.1f} ms of integer dots = {ms / floor_ms:.2f} floor "
              f"steps, {ms / (1.1 * floor_ms):.2f} steps of 1.1x the floor (goal <= {goal})")
        if tile_ns is not None:
            ms = rows * blocks * tile_ns / a.threads / 1e6
            print(f"  at the real tile's cost per row: >= {ms:.1f} ms = {ms / floor_ms:.2f} floor steps")
            figures["passes"][rows] |= {"tile_ms": ms, "tile_floor_steps": ms / floor_ms}
    results.record(a, "scripts.profile.int8_bound", figures)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
