#!/usr/bin/env python
"""Decode speed deep in a conversation: our target's plain decode after a context of D tokens, against llama.cpp's
on the same GGUF (`llama-bench -n N -d D`, its "tg N @ dD"). Attention grows with D while the weights do not, so
this is where the KV cache and the attention kernel show.

Ours: a plain greedy request over a D-token prompt with N new tokens (EOS switched off so every run decodes N),
the decode rate being N / (total - prefill); one warm-up at the smallest depth, then the mean of --reps.
llama.cpp: the build ../shared/bench/llama_cpp_peer.sh caches (see bench_prefill.py), same thread count;
skipped with a line when there is none. Run one after the other, never beside another benchmark.

    python scripts/bench_depth.py [--depths 0,1000,2000] [--tokens 32] [--reps 2]
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import torch

from bench_prefill import llama_bench, side_by_side

from engine.api.config import SamplingParams, SpecParams
from engine.runtime.engine import Engine
from engine.io.loading import load_engine
from engine.api.events import Summary
from engine.io.provision import default_pair


def ours(engine: Engine, depth: int, n: int) -> float:
    """Decode rate (tokens/s) of n plain tokens after a depth-token prompt (the cache reset first)."""
    ids = [1000 + i % 5000 for i in range(max(depth, 1))]  # ordinary vocabulary ids; the content does not matter
    engine.reset()
    *_, s = engine.generate(ids, SamplingParams(max_new_tokens=n), SpecParams(enabled=False))
    assert isinstance(s, Summary) and s.new_tokens == n, s
    return n / (s.total_s - s.prefill_s)


def theirs(binary: Path, target: Path, depths: list[int], n: int, reps: int, threads: int) -> dict[int, float]:
    run = subprocess.run([str(binary), "-m", str(target), "-t", str(threads), "-p", "0", "-n", str(n),
                          "-d", ",".join(map(str, depths)), "-r", str(reps), "-o", "json"],
                         capture_output=True, text=True, check=True)
    return {r["n_depth"]: r["avg_ts"] for r in json.loads(run.stdout) if r["n_gen"] == n}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--depths", default="0,1000,2000")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    depths = [int(d) for d in a.depths.split(",")]
    target, draft = default_pair()
    engine = load_engine(str(target), str(draft), device="cpu")
    engine.eos_ids = set()  # decode exactly --tokens every time
    ours(engine, min(depths), a.tokens)  # warm-up
    mine = {d: sum(ours(engine, d, a.tokens) for _ in range(a.reps)) / a.reps for d in depths}
    del engine
    binary = llama_bench()
    peer = theirs(binary, target, depths, a.tokens, a.reps, torch.get_num_threads()) if binary else None
    if binary is None:
        print("llama.cpp: no llama-bench build found (run ../shared/bench/llama_cpp_peer.sh once); skipped")
    print(f"target plain decode of {a.tokens} tokens after D context tokens, {torch.get_num_threads()} threads, "
          f"tokens/s (mean of {a.reps}):")
    side_by_side(mine, peer, lambda d: f"D = {d:>5}", "6.2f")
    return 0


if __name__ == "__main__":
    sys.exit(main())
