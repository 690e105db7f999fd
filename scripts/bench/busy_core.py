"""The engine beside a program that keeps one core busy: the kernels' threads as engine/cpu/threads.py sets them
(the cores other programs leave free) against the process's fixed setting, with the busy program running and paused.

A busy program (a Python loop, one core) is started once and paused (SIGSTOP) or resumed (SIGCONT) prompt by prompt;
at each state both settings decode the same prompts, plain and in the app's default mode, the order of settings
alternating so that minutes of host drift touch both alike. Reported per state and mode: tok/s with each setting
(the medians over prompts) and governed / fixed, and whether every reply of a prompt, in every state, setting and
mode, was the same (greedy: plain's).

    python -m scripts.bench.busy_core [--prompts ../shared/bench/prompts.jsonl] [--n 3] [--max-new-tokens 96]
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

from engine.api.config import SamplingParams
from engine.api.events import RoundEvent
from engine.cpu.threads import ThreadGovernor
from engine.tools import results
from engine.tools.bench import load, mode_spec
from scripts.bench.kernels import cpu_line

BUSY = "while True:\n    sum(i * i for i in range(10000))\n"
PROMPTS = Path(__file__).resolve().parents[2].parent / "shared" / "bench" / "prompts.jsonl"
SETTLE_S = 1.5  # after pausing or resuming the busy program: the governor's windows see the new state (WINDOW_S x 2)
MODES = ("plain", "default")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", default=str(PROMPTS))
    ap.add_argument("--n", type=int, default=3, help="the first N prompts of the file")
    ap.add_argument("--max-new-tokens", type=int, default=96)
    results.add_arguments(ap)
    a = ap.parse_args()
    rows = [json.loads(line) for line in Path(a.prompts).read_text(encoding="utf-8").splitlines() if line.strip()]
    engine = load(None, None, None)
    governor, fixed = engine.threads, ThreadGovernor.fixed()
    if engine.device.type != "cpu":
        raise SystemExit("the engine runs on a GPU here: no CPU threads to govern")
    greedy = SamplingParams(temperature=0.0, max_new_tokens=a.max_new_tokens)
    print(cpu_line())
    print(f"threads set by the process: {torch.get_num_threads()}; {a.n} prompts, {a.max_new_tokens} new tokens")
    rates: dict[tuple[str, str, str], list[float]] = {}
    fewer: dict[tuple[str, str], list[bool]] = {}  # per round: ran on fewer threads than the process's setting
    ceiling = torch.get_num_threads()
    identical = True
    busy = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        for n, row in enumerate(rows[: a.n]):
            ids = engine.encode_chat(row["messages"])
            reference = None
            for state in (("busy", "quiet") if n % 2 == 0 else ("quiet", "busy")):
                os.kill(busy.pid, signal.SIGCONT if state == "busy" else signal.SIGSTOP)
                time.sleep(SETTLE_S)
                for setting in (("governed", "fixed") if n % 2 == 0 else ("fixed", "governed")):
                    engine.threads = governor if setting == "governed" else fixed
                    for mode in MODES:
                        engine.reset()
                        counts = []  # the kernels' thread count at each round
                        for s in engine.generate(ids, greedy, mode_spec(mode, 4)):
                            if isinstance(s, RoundEvent):
                                counts.append(torch.get_num_threads())
                        rates.setdefault((state, mode, setting), []).append(s.tokens_per_s)
                        fewer.setdefault((state, setting), []).extend(c < ceiling for c in counts)
                        reference = reference or s.token_ids
                        identical &= s.token_ids == reference
                        print(f"  {row.get('id', n)} {state:5s} {setting:8s} {mode:7s} {s.tokens_per_s:6.2f} tok/s  "
                              f"threads {min(counts, default=ceiling)}-{max(counts, default=ceiling)}", flush=True)
    finally:
        engine.threads = governor
        busy.kill()
        busy.wait()
    figures: dict = {"prompts": a.n, "max_new_tokens": a.max_new_tokens, "threads": torch.get_num_threads(),
                     "identical": identical, "rates": {}}
    print(f"{'':6s}{'mode':8s}{'governed':>10s}{'fixed':>10s}{'governed/fixed':>16s}")
    for state in ("busy", "quiet"):
        for mode in MODES:
            g = statistics.median(rates[(state, mode, "governed")])
            f = statistics.median(rates[(state, mode, "fixed")])
            print(f"{state:6s}{mode:8s}{g:10.2f}{f:10.2f}{g / f:16.2f}")
            figures["rates"][f"{state} {mode}"] = {"governed_tok_s": g, "fixed_tok_s": f, "ratio": g / f}
        share = statistics.mean(fewer[(state, "governed")])
        print(f"{state:6s}governed rounds on fewer than {ceiling} threads: {share:.0%}")
        figures[f"{state} governed rounds on fewer threads"] = share
    print("every reply equalled plain decoding:", "yes" if identical else "NO")
    results.record(a, "scripts.bench.busy_core", figures)


if __name__ == "__main__":
    main()
