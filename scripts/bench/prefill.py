#!/usr/bin/env python
"""Prompt processing (what sets the time to first token): our target prefill against llama.cpp's on the same GGUF.

Ours: `Summary.prefill_s` of a plain request over N prompt tokens (the cache reset before each run; one warm-up
run, then the mean rate of --reps, as llama-bench reports). llama.cpp: `llama-bench -p N -n 0` with the same
thread count, from the build that
../shared/bench/llama_cpp_peer.sh caches (LLAMA_CPP_BIN or ~/.cache/speclens-peer/llama.cpp-*/build/bin);
skipped with a line when there is none. Run one after the other, never beside another benchmark.

    python -m scripts.bench.prefill [--lengths 128,512] [--reps 3]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from engine.api.config import SamplingParams, SpecParams
from engine.api.events import Summary
from engine.io.loading import load_engine
from engine.io.provision import default_pair
from engine.runtime.engine import Engine
from engine.tools import results


def ours(engine: Engine, n: int, reps: int) -> float:
    """Mean prefill rate (tokens/s) over `reps` runs of an n-token prompt, after one warm-up run."""
    ids = [1000 + i % 5000 for i in range(n)]  # ordinary vocabulary ids; the content does not change the cost
    rates = []
    for _ in range(reps + 1):
        engine.reset()
        *_, s = engine.generate(ids, SamplingParams(max_new_tokens=1), SpecParams(enabled=False))
        assert isinstance(s, Summary)
        rates.append(n / s.prefill_s)
    return sum(rates[1:]) / reps


def llama_bench() -> Path | None:
    if os.environ.get("LLAMA_CPP_BIN"):
        found = [Path(os.environ["LLAMA_CPP_BIN"]) / "llama-bench"]
    else:
        peer = Path(os.environ.get("SPECLENS_PEER_DIR", Path.home() / ".cache" / "speclens-peer"))
        found = sorted(peer.glob("llama.cpp-*/build/bin/llama-bench"))
    return next((p for p in found if p.is_file()), None)


def theirs(binary: Path, target: Path, lengths: list[int], reps: int, threads: int) -> dict[int, float]:
    run = subprocess.run([str(binary), "-m", str(target), "-t", str(threads), "-p", ",".join(map(str, lengths)),
                          "-n", "0", "-r", str(reps), "-o", "json"], capture_output=True, text=True, check=True)
    return {r["n_prompt"]: r["avg_ts"] for r in json.loads(run.stdout) if r["n_gen"] == 0}


def side_by_side(mine: dict[int, float], peer: dict[int, float] | None, label, fmt: str) -> None:
    """One line per key: label(key), our figure, and llama.cpp's and the ratio where it measured that key."""
    for n, ours_v in mine.items():
        line = f"  {label(n)}: ours {ours_v:{fmt}}"
        if peer and n in peer:
            line += f"   llama.cpp {peer[n]:{fmt}}   ours / llama.cpp {ours_v / peer[n]:.2f}x"
        print(line)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--lengths", default="128,512")
    ap.add_argument("--reps", type=int, default=3)
    results.add_arguments(ap)
    a = ap.parse_args()
    lengths = [int(n) for n in a.lengths.split(",")]
    target, draft = default_pair()
    engine = load_engine(str(target), str(draft), device="cpu")
    mine = {n: ours(engine, n, a.reps) for n in lengths}
    del engine
    binary = llama_bench()
    peer = theirs(binary, target, lengths, a.reps, torch.get_num_threads()) if binary else None
    if binary is None:
        print("llama.cpp: no llama-bench build found (run ../shared/bench/llama_cpp_peer.sh once); skipped")
    print(f"target prefill, {torch.get_num_threads()} threads, tokens/s (mean of {a.reps}):")
    side_by_side(mine, peer, lambda n: f"{n:>5} tokens", "7.1f")
    results.record(a, "scripts.bench.prefill", {"threads": torch.get_num_threads(), "reps": a.reps,
                                                "ours_tokens_per_s": mine, "llama_cpp_tokens_per_s": peer})
    return 0


if __name__ == "__main__":
    sys.exit(main())
