"""What a busy neighbour process costs the engine: the pair's passes with a stand-in for a repainting window paused and
running, in turns.

The stand-in (a few lines of C, built here with the C compiler) wakes every --period ms and spins --busy ms: by
default 20 Hz and 2.5 ms, 5% of a core, about what the app's window takes while it paints. It is paused (SIGSTOP)
and resumed (SIGCONT) round by round, the order alternating, so that both states span the same minutes of a host
whose speed drifts. Each round times a one-token target step, a 5-token target pass and a one-token draft step
five times each and keeps their mean (a median would drop the passes the neighbour hit). Reported per case: the
median of the rounds' running / paused ratios. The engine's threads meet at the end of every matmul, so a neighbour
that preempts one of them stalls both: expect about its own CPU share.

    python -m scripts.profile.neighbour [--rounds 40] [--period 50] [--busy 2.5]
"""
from __future__ import annotations

import argparse
import os
import shutil
import signal
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from engine.tools import results
from engine.tools.bench import load
from scripts.bench.kernels import cpu_line
from scripts.bench.pair_passes import PairPasses
from scripts.profile.ab_builds import PROMPT

BURNER = r"""
#include <stdlib.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
int main(int argc, char** argv) {
    const double period = atof(argv[1]) / 1e3, busy = atof(argv[2]) / 1e3;
    volatile unsigned long spin = 0;
    for (;;) {
        const double t0 = now();
        while (now() - t0 < busy) ++spin;
        const struct timespec rest = {0, (long)((period - busy) * 1e9)};
        nanosleep(&rest, 0);
    }
}
"""
CASES = (("target", 1), ("target", 5), ("draft", 1))


def start_burner(folder: Path, period_ms: float, busy_ms: float) -> subprocess.Popen:
    cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc")
    if not cc:
        raise SystemExit("scripts/profile/neighbour.py needs a C compiler (gcc) to build its stand-in")
    src, exe = folder / "burner.c", folder / "burner"
    src.write_text(BURNER)
    subprocess.run([cc, "-O2", str(src), "-o", str(exe)], check=True)
    return subprocess.Popen([str(exe), str(period_ms), str(busy_ms)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--period", type=float, default=50.0, help="ms between the stand-in's wake-ups")
    ap.add_argument("--busy", type=float, default=2.5, help="ms it spins at each")
    results.add_arguments(ap)
    a = ap.parse_args()
    if not 0 < a.busy < a.period:
        raise SystemExit("--busy must be above 0 and below --period")
    engine = load(None, None, None)
    passes = PairPasses(engine, engine.encode_chat(PROMPT))

    print(cpu_line())
    print(f"stand-in: {a.busy:g} ms of spinning every {a.period:g} ms ({a.busy / a.period:.0%} of a core)")
    ms: dict[tuple[str, int, str], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        burner = start_burner(Path(tmp), a.period, a.busy)
        try:
            for r in range(a.rounds):
                for state in (("paused", "running") if r % 2 else ("running", "paused")):
                    os.kill(burner.pid, signal.SIGCONT if state == "running" else signal.SIGSTOP)
                    time.sleep(a.period / 1e3)  # a whole period in the new state before timing
                    for kind, width in CASES:
                        mean = statistics.mean(passes.once(kind, width) for _ in range(5))
                        ms.setdefault((kind, width, state), []).append(mean)
        finally:
            burner.kill()
            burner.wait()
    figures: dict = {"period_ms": a.period, "busy_ms": a.busy, "rounds": a.rounds, "passes": {}}
    for kind, width in CASES:
        paused, running = ms[(kind, width, "paused")], ms[(kind, width, "running")]
        ratios = sorted(b / x for x, b in zip(paused, running))
        q = len(ratios) // 4
        print(f"  {kind} pass of {width}: paused {statistics.median(paused):7.2f} ms  running "
              f"{statistics.median(running):7.2f} ms  running/paused {statistics.median(ratios):.3f} "
              f"(quartiles {ratios[q]:.3f}-{ratios[-q - 1]:.3f})")
        figures["passes"][f"{kind} pass of {width}"] = {
            "paused_ms": statistics.median(paused), "running_ms": statistics.median(running),
            "running_over_paused": statistics.median(ratios), "quartiles": [ratios[q], ratios[-q - 1]]}
    results.record(a, "scripts.profile.neighbour", figures)


if __name__ == "__main__":
    main()
