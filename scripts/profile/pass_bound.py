"""How near a verify pass of T tokens can come to one step on this CPU: the target's passes beside the integer-dot
peak that bounds them.

A pass of T tokens multiplies every weight T times; its int8 products cannot run faster than the CPU's dot
instructions allow (`scripts/profile/dot_peak.cpp`, built here with g++ -march=native: independent chains of vpdpbusd, or
AVX2's vpmaddubsw, on the kernels' threads). A one-token step, meanwhile, is bound by reading the weights once, so
on a host whose read bandwidth moves, the step moves and the pass (bound by compute) barely does: a pass's cost in
steps depends on the minute. For each width this prints, from rounds in which the widths and a read of the memory
bandwidth take turns (split into the host's memory moods where the bandwidths part, as `scripts/profile/ab_builds.py` does):
- the pass in ms and in one-token steps, and the rate its products ran at, as a share of the peak;
- `bound`: the fewest steps a pass could take if every product ran at the peak (T x products a row / peak,
  at least one step);
- `goal needs`: for the pass goals (5 tokens in 1.25 steps, 9 in 1.6), the share of the peak the products
  would need to run at if the whole pass did nothing else; above 100% the goal is out of reach in that mood.

    python -m scripts.profile.pass_bound [--rounds 30] [--threads 2] [--widths 1,2,3,5,9]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.cpu.linear import QuantLinear
from engine.tools import results
from engine.tools.bench import load
from scripts.bench.cpu import pass_times
from scripts.bench.kernels import ReadBandwidth, cpu_line
from scripts.profile.ab_builds import moods
from scripts.profile.step import linears

GOALS = {5: 1.25, 9: 1.6}  # a pass of T tokens in at most this many one-token steps
SOURCE = Path(__file__).with_name("dot_peak.cpp")


@dataclass(frozen=True)
class Peak:
    name: str
    gps: float  # G products a second, all threads
    ghz: float
    threads: int

    def per_cycle(self) -> float:
        """Products a cycle on each core."""
        return self.gps / self.ghz / self.threads


def parse_peak(text: str) -> Peak:
    """The fastest dot of dot_peak's output."""
    fields = [line.split() for line in text.splitlines()]
    clocks = [float(f[1]) for f in fields if f and f[0] == "clock"]
    dots = [(float(f[3]), f[1], int(f[2])) for f in fields if f and f[0] == "dot"]
    if not dots or not clocks or clocks[-1] <= 0:
        raise ValueError(f"dot_peak printed no clock or no dot:\n{text}")
    gps, name, threads = max(dots)
    return Peak(name, gps, clocks[-1], threads)


def compiler() -> str | None:
    return os.environ.get("CXX") or shutil.which("g++")


def build_peak(folder: Path) -> Path:
    """scripts/profile/dot_peak.cpp built for this CPU into folder; the executable's path."""
    cxx = compiler()
    if not cxx:
        raise SystemExit("scripts/profile/pass_bound.py needs g++ to build its dot micro-benchmark (scripts/profile/dot_peak.cpp)")
    exe = folder / "dot_peak"
    subprocess.run([cxx, "-O2", "-march=native", "-pthread", str(SOURCE), "-o", str(exe)], check=True)
    return exe


def measure_peak(threads: int) -> Peak:
    with tempfile.TemporaryDirectory() as tmp:
        exe = build_peak(Path(tmp))
        out = subprocess.run([str(exe), str(threads)], check=True, capture_output=True, text=True).stdout
    return parse_peak(out)


def steps_bound(width: int, products_per_row: float, peak_gps: float, step_ms: float) -> float:
    """The fewest one-token steps a pass of `width` tokens could take with every product at the peak."""
    return max(1.0, width * products_per_row / (peak_gps * 1e9) * 1e3 / step_ms)


def share_needed(width: int, products_per_row: float, peak_gps: float, step_ms: float, goal_steps: float) -> float:
    """The share of the peak a pass's products need to fit in `goal_steps` steps, doing nothing else."""
    return width * products_per_row / (goal_steps * step_ms * 1e-3) / (peak_gps * 1e9)


def products_per_row(model) -> tuple[float, float]:
    """(the layers', the LM head's) weights: int8 products per token of a pass."""
    layers = sum(lin.in_features * lin.out_features for lin in linears(model))
    head = model.lm_head
    return float(layers), float(head.in_features * head.out_features if isinstance(head, QuantLinear) else 0)


def report(mood: str, idx: list[int], times: dict[int, list[float]], bws: list[float], per_row: float,
           peak: Peak) -> dict:
    """Prints the mood's table; returns its figures, for the run's record."""
    med = {w: statistics.median(ts[i] for i in idx) for w, ts in times.items()}
    step = med[min(med)]
    bw = statistics.median(bws[i] for i in idx)
    print(f"\n== {mood}: {len(idx)} rounds, read bandwidth {bw:.1f} GB/s, one-token step {step:.2f} ms ==")
    print(f"  {'tokens':>6} {'ms':>8} {'steps':>6} {'products at':>12} {'bound':>6} {'goal':>5} {'goal needs':>11}")
    figures: dict = {"rounds": len(idx), "read_gbs": bw, "step_ms": step, "passes": {}}
    for w, ms in med.items():
        at = w * per_row / (ms * 1e-3) / (peak.gps * 1e9)
        figures["passes"][w] = {"ms": ms, "steps": ms / step, "products_share_of_peak": at,
                                "bound_steps": steps_bound(w, per_row, peak.gps, step)}
        line = (f"  {w:>6} {ms:8.2f} {ms / step:6.2f} {at:11.0%} {steps_bound(w, per_row, peak.gps, step):6.2f}")
        if w in GOALS:
            line += f" {GOALS[w]:5.2f} {share_needed(w, per_row, peak.gps, step, GOALS[w]):10.0%}"
            figures["passes"][w] |= {"goal_steps": GOALS[w],
                                     "goal_needs_share": share_needed(w, per_row, peak.gps, step, GOALS[w])}
        print(line)
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--widths", default="1,2,3,5,9")
    ap.add_argument("--context", type=int, default=200, help="prompt tokens in the cache before the timed passes")
    results.add_arguments(ap)
    args = ap.parse_args()
    widths = sorted({1, *(int(w) for w in args.widths.split(","))})
    torch.set_num_threads(args.threads)
    print(f"CPU: {cpu_line()}")
    before = measure_peak(args.threads)
    engine = load(None, None, None)  # the embedded pair, settled: its weights on huge pages, as in the app
    layers, head = products_per_row(engine.target)
    per_row = layers + head
    print(f"target: {per_row / 1e9:.3f} G products a token ({layers / 1e9:.3f} G in the layers, "
          f"{head / 1e9:.3f} G in the LM head)")
    reader = ReadBandwidth()
    reader.once()  # the first read faults the pages in
    text = "def quicksort(items):\n    " * (args.context // 8)
    ids = engine.tokenizer.encode(text)[: args.context]
    bws: list[float] = []
    times = pass_times(engine, ids, widths, args.rounds, after_round=lambda: bws.append(reader.once()))
    after = measure_peak(args.threads)
    peak = max(before, after, key=lambda p: p.gps)
    print(f"dot peak: {peak.name} on {peak.threads} threads, {peak.gps:.0f} G products a second "
          f"({peak.per_cycle():.1f} a cycle a core at {peak.ghz:.2f} GHz; before the passes {before.gps:.0f}, "
          f"after {after.gps:.0f})")
    labels = moods(bws)
    figures = {"products_a_token": per_row, "layers_products": layers, "head_products": head,
               "peak": {"name": peak.name, "gps": peak.gps, "ghz": peak.ghz, "threads": peak.threads,
                        "gps_before": before.gps, "gps_after": after.gps}, "moods": {}}
    for mood in sorted(set(labels)):
        figures["moods"][mood] = report(mood, [i for i, m in enumerate(labels) if m == mood], times, bws, per_row,
                                        peak)
    results.record(args, "scripts.profile.pass_bound", figures)


if __name__ == "__main__":
    main()
