"""How fast the AVX2 kernels' integer dot can possibly go on this CPU, and what that allows a multi-token pass.

The kernels' Q4_K tile does, per row and per block of 8 columns x 32 inputs: 8 broadcasts of 4 activations,
8 `vpmaddubsw`, 7 int16 adds, a `vpmaddwd` by the block's scales, a conversion to float and an FMA by the row's
block scale (kernels_x86.h; the order the bits depend on). This times exactly that sequence in inline assembly with
every operand in registers (no weight decoding, no loads but the activations', no spills), over 4 independent rows:
an upper bound on the tile's speed. The decoding of the weights, the Q4_K mins and everything outside the tile
come on top.

From it: the least time a pass of R tokens can take over the target's matrices (all of them counted at the
Q4_K block's cost, though Q6_K's costs more), on the given threads, against the step's memory floor (the packed
weights a step reads over the read bandwidth measured here, as scripts/profile_step.py). Issue 24 asks a pass of
5 tokens for <= 1.25 steps and of 9 for <= 1.6.

    python scripts/bench_int8_bound.py [--threads 2] [--gguf TARGET.gguf]
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path

from engine.io.gguf_file import GGUFFile
from engine.io.provision import default_pair
from bench_kernels import cpu_line, read_bandwidth

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
alignas(64) int8_t act[4096];
alignas(64) float dx[64];
__attribute__((noinline)) double run(long n) {
    auto t0 = std::chrono::steady_clock::now();
    for (long i = 0; i < n; ++i)
        asm volatile(BODY :: "r"(act), "r"(dx) : "xmm9", "xmm10", "xmm11", "xmm12", "xmm14", "xmm15", "memory");
    return std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count();
}
int main() {
    const long n = 1000000;
    double best = 1e30;
    for (int k = 0; k < 41; ++k) best = std::min(best, run(n) / n / ROWS);
    std::printf("%.4f\n", best);
}
"""


def ns_per_row_block() -> float:
    """Best of 41 timings of the sequence, ns per row-block per row, on one core."""
    body = "".join(f'"{line}\\n"\n' for r in range(ROWS) for line in row_asm(r))
    with tempfile.TemporaryDirectory() as d:
        src, exe = Path(d) / "bound.cpp", Path(d) / "bound"
        src.write_text(SOURCE.replace("BODY", body).replace("ROWS", str(ROWS)))
        subprocess.run([shutil.which("g++") or "g++", "-O2", "-mavx2", "-mfma", "-o", str(exe), str(src)], check=True)
        return float(subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout)


def step_matrices(path: Path) -> tuple[int, int]:
    """Row-blocks (8 columns x 32 inputs) and bytes of the matrices a step reads: the layers' and the LM head."""
    g = GGUFFile(path, check_data=False)
    head = "output.weight" if "output.weight" in g.tensors else "token_embd.weight"
    mats = [t for n, t in g.tensors.items() if len(t.shape) == 2 and (n.startswith("blk.") or n == head)]
    return sum(t.numel for t in mats) // 256, sum(t.nbytes for t in mats)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gguf", help="the target GGUF (default: the embedded pair's)")
    a = ap.parse_args()
    path = Path(a.gguf) if a.gguf else default_pair()[0]
    blocks, nbytes = step_matrices(path)
    ns = ns_per_row_block()
    gbs = read_bandwidth(a.threads)
    floor_ms = nbytes / gbs / 1e6
    print(cpu_line())
    print(f"the AVX2 tile's integer dot, operands in registers: {ns:.3f} ns per row-block per row (one core)")
    print(f"{path.name}: {blocks / 1e6:.2f} M row-blocks a row; a step reads {nbytes / 1e6:.0f} MB, at {gbs:.1f} GB/s "
          f"a floor of {floor_ms:.1f} ms")
    for rows, goal in ((5, 1.25), (9, 1.6)):
        ms = rows * blocks * ns / a.threads / 1e6
        print(f"pass of {rows} tokens on {a.threads} threads: >= {ms:.1f} ms of integer dots = {ms / floor_ms:.2f} floor "
              f"steps, {ms / (1.1 * floor_ms):.2f} steps of 1.1x the floor (goal <= {goal})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
