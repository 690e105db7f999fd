#!/usr/bin/env python
"""Decode speed deep in a conversation: our target's plain decode after a context of D tokens, against llama.cpp's
on the same GGUF (`llama-bench -n N -d D`, its "tg N @ dD"). Attention grows with D while the weights do not, so
this is where the KV cache and the attention kernel show.

Ours: a plain greedy request over a D-token prompt with N new tokens (EOS switched off so every run decodes N),
the decode rate being N / (total - prefill); one warm-up at the smallest depth, then the mean of --reps.
llama.cpp: the build ../shared/bench/llama_cpp_peer.sh caches (see scripts/bench/prefill.py), same thread count;
skipped with a line when there is none. Run one after the other, never beside another benchmark.

--spec adds speculation deep in a conversation: each benchmark prompt (../shared/bench/prompts.jsonl) asked after
an earlier turn in which the user pasted a document of D tokens (an old README of this project, fixed, cut to D tokens) and the assistant
acknowledged it. Our plain decode and the app's default speculative settings (hybrid drafter, K <= 4, early stop)
take turns on each prompt, greedy, --spec-tokens new tokens, the conversation's cache kept between requests as the
app keeps it (each request prefills only its own message; decode rates leave every prefill out). Printed per depth:
both rates, their ratio, the ratio to llama.cpp's plain decode at that depth, the acceptance rate alpha, and the
cost of the verify passes of 5 rows in plain steps (only attention grows with D, and a pass of T rows does T
queries' attention).

    python -m scripts.bench.depth [--depths 0,1000,2000] [--tokens 32] [--reps 2] [--spec] [--spec-tokens 64]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

import torch

from engine.api.config import APP_DEFAULTS, STOP_BELOW, SamplingParams, SpecParams
from engine.api.events import RoundEvent, Summary
from engine.io.loading import load_engine
from engine.io.provision import default_pair
from engine.runtime.engine import Engine
from engine.tools import results as records  # spec_table's `results` is its own
from engine.tools.bench import read_prompts
from scripts.bench.cpu import alpha_hat
from scripts.bench.prefill import llama_bench, side_by_side

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ROOT.parent / "shared" / "bench" / "prompts.jsonl"
DEFAULT_SPEC = APP_DEFAULTS.spec_params()


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


# The pasted document: the README as it stood before it was cut to a front door (2,138 lines, ~50k tokens), read
# from git so that every run pastes the same text whatever the README says today.
DOCUMENT_REV = "5ce0ba6:README.md"


def pasted_document() -> str:
    run = subprocess.run(["git", "-C", str(ROOT), "show", DOCUMENT_REV], capture_output=True, text=True, timeout=30)
    if run.returncode != 0:
        raise SystemExit(f"the depth benchmark pastes {DOCUMENT_REV} and needs this repository's git history: "
                         f"{run.stderr.strip()}")
    return run.stdout


def pasted(engine: Engine, document: list[int], depth: int) -> list[dict[str, str]]:
    """An earlier exchange whose document is the first `depth` of the document's tokens ([] at depth 0)."""
    if depth == 0:
        return []
    if len(document) < depth:
        raise SystemExit(f"the document has {len(document)} tokens, fewer than the depth {depth}")
    text = engine.tokenizer.decode(document[:depth])
    return [{"role": "user", "content": "Keep this document in mind for my next questions.\n\n" + text},
            {"role": "assistant", "content": "Understood: I have read the document."}]


class Tally:
    """One mode's decode over the prompts at one depth."""

    def __init__(self) -> None:
        self.tokens, self.seconds = 0, 0.0
        self.rounds: list[RoundEvent] = []

    def add(self, engine: Engine, ids: list[int], n: int, spec: SpecParams) -> None:
        *events, s = engine.generate(ids, SamplingParams(max_new_tokens=n), spec)
        assert isinstance(s, Summary), s
        self.tokens += s.new_tokens
        self.seconds += s.total_s - s.prefill_s - s.draft_prefill_ms / 1e3
        self.rounds += [e for e in events if isinstance(e, RoundEvent)]

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds

    def verify_ms(self, width: int) -> float | None:
        ms = [e.verify_ms for e in self.rounds if len(e.drafted) + 1 == width]
        return statistics.median(ms) if ms else None


def speculation_at(engine: Engine, depths: list[int], n: int) -> dict[int, tuple[Tally, Tally, int]]:
    """Per depth: (plain, default speculative, the earlier exchange's tokens before the question)."""
    prompts = [p["messages"] for p in read_prompts(PROMPTS)]
    document = engine.tokenizer.encode(pasted_document(), add_special_tokens=False)
    out = {}
    for depth in depths:
        engine.reset()
        plain, spec = Tally(), Tally()
        earlier = pasted(engine, document, depth)
        asked = [engine.encode_chat(earlier + messages) for messages in prompts]
        if max(map(len, asked)) + n > engine.max_seq_len:
            raise SystemExit(f"--spec at D = {depth}: a prompt of {max(map(len, asked))} tokens and {n} new ones do "
                             f"not fit the {engine.max_seq_len}-token context; choose a smaller depth")
        for ids in asked:
            plain.add(engine, ids, n, SpecParams(enabled=False))
            spec.add(engine, ids, n, DEFAULT_SPEC)
        out[depth] = plain, spec, len(engine.encode_chat(earlier)) if earlier else 0
        print(f"  D = {depth}: done", flush=True)
    return out


def spec_table(results: dict[int, tuple[Tally, Tally, int]], peer: dict[int, float] | None) -> None:
    print(f"{'D':>6} {'context':>8} {'plain tok/s':>12} {'spec tok/s':>11} {'spec/plain':>11} {'spec/llama.cpp':>15} "
          f"{'alpha':>6} {'pass 5 / step':>14}")
    for depth, (plain, spec, context) in results.items():
        step, five = plain.verify_ms(1), spec.verify_ms(5)
        theirs_v = f"{spec.rate / peer[depth]:.2f}x" if peer and depth in peer else "-"
        passes = f"{five / step:.2f}" if step and five else "-"
        print(f"{depth:>6} {context:>8} {plain.rate:>12.2f} {spec.rate:>11.2f} {spec.rate / plain.rate:>10.2f}x "
              f"{theirs_v:>15} {alpha_hat(spec.rounds):>6.2f} {passes:>14}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--depths", default="0,1000,2000")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--spec", action="store_true", help="also speculation deep in a conversation (see above)")
    ap.add_argument("--spec-tokens", type=int, default=64)
    records.add_arguments(ap)
    a = ap.parse_args()
    depths = [int(d) for d in a.depths.split(",")]
    target, draft = default_pair()
    engine = load_engine(str(target), str(draft), device="cpu")
    engine.settle()  # the weights on huge pages first: time the steady state
    eos, engine.eos_ids = engine.eos_ids, set()  # decode exactly --tokens every time (the replies below end at EOS)
    ours(engine, min(depths), a.tokens)  # warm-up
    mine = {d: sum(ours(engine, d, a.tokens) for _ in range(a.reps)) / a.reps for d in depths}
    engine.eos_ids = eos
    spec = speculation_at(engine, depths, a.spec_tokens) if a.spec else None
    del engine
    binary = llama_bench()
    peer = theirs(binary, target, depths, a.tokens, a.reps, torch.get_num_threads()) if binary else None
    if binary is None:
        print("llama.cpp: no llama-bench build found (run ../shared/bench/llama_cpp_peer.sh once); skipped")
    print(f"target plain decode of {a.tokens} tokens after D context tokens, {torch.get_num_threads()} threads, "
          f"tokens/s (mean of {a.reps}):")
    side_by_side(mine, peer, lambda d: f"D = {d:>5}", "6.2f")
    if spec is not None:
        print(f"\nthe benchmark prompts after a pasted document of D tokens, {a.spec_tokens} new tokens, greedy; "
              f"ours plain and speculative (hybrid, K <= 4, early stop {STOP_BELOW}) taking turns; spec/llama.cpp "
              "against its plain decode above:")
        spec_table(spec, peer)
    figures = {"tokens": a.tokens, "reps": a.reps, "ours_plain_tokens_per_s": mine,
               "llama_cpp_plain_tokens_per_s": peer}
    if spec is not None:
        figures["speculation"] = {d: {"context": ctx, "plain_tokens_per_s": p.rate, "spec_tokens_per_s": s.rate,
                                      "alpha": alpha_hat(s.rounds), "step_ms": p.verify_ms(1),
                                      "pass5_ms": s.verify_ms(5)} for d, (p, s, ctx) in spec.items()}
    records.record(a, "scripts.bench.depth", figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
