"""Does the draft finder's ranking hold up? The finder (engine/tools/draft_finder.py, what `speclens-bench
--find-drafts` and Model > Find a draft run) ranks the local drafts for a target; this takes its top two measured
candidates and measures them again the way speclens-bench does (engine/tools/bench.py's run_mode: each pair loaded
as `speclens-bench --target T --draft D` loads it, plain decoding and then the candidate's mode, draft or ngram, at
the K the finder found best for it), on the same prompts, and prints both rankings side by side with whether they
agree.

    python -m scripts.bench.finder_agreement [--prompts P] [--budget S] [--max-new-tokens N] [--k 1,2,3,4,6]
        [--repeats R] [--target T] [--candidates A B ...]

Deterministic in what it runs: greedy, the same prompts (P, else the finder's three built-in ones), a fixed number
of new tokens. The two candidates' pairs are both loaded and measured prompt by prompt in turn (the order swapped on
every prompt), so drift between minutes on a busy machine falls on both alike. Each candidate's speedup is its
decode rate over plain decoding's measured in the same load, prompt for prompt, as the finder's is; greedy output
is checked against plain's for both. A timing: run it on a quiet machine.
"""
from __future__ import annotations

import argparse
import gc
import sys
from dataclasses import dataclass

from engine.api.config import SamplingParams, SpecParams
from engine.tools import bench, draft_finder, results
from engine.tools.draft_finder import BUILTIN_PROMPTS, FinderConfig, Measured
from engine.tools.prompt_file import read_prompts

TIE = 0.03  # two bench speedups closer than this (relative) are one figure on a quiet machine's repeat-to-repeat noise


@dataclass(frozen=True)
class Ranked:
    """One candidate's figure in one ranking: its speedup over plain decoding at its K."""

    name: str
    speedup: float
    k: int


@dataclass(frozen=True)
class Verdict:
    agree: bool | None  # None: the bench cannot tell the two apart (within tie)
    sentence: str


def verdict(finder: list[Ranked], bench_side: list[Ranked], tie: float = TIE) -> Verdict:
    """Whether the bench puts the finder's first candidate ahead of its second. finder: the finder's top two, first
    first; bench_side: the same two candidates (any order) with the bench's figures. Within `tie` of each other the
    bench's figures decide nothing, and the verdict says so instead of agreeing or not."""
    if len(finder) != 2 or len(bench_side) != 2:
        raise ValueError("the agreement compares exactly two candidates on each side")
    if {r.name for r in finder} != {r.name for r in bench_side}:
        raise ValueError("the two rankings must name the same two candidates")
    if not 0 <= tie < 1:
        raise ValueError(f"tie must be a fraction in [0, 1), got {tie!r}")
    first, second = (next(r for r in bench_side if r.name == f.name) for f in finder)
    if min(first.speedup, second.speedup) <= 0:
        return Verdict(None, "a bench figure is zero: nothing was decoded to compare")
    gap = first.speedup / second.speedup - 1
    if abs(gap) < tie:
        return Verdict(None, f"too close to call: speclens-bench measured {first.name} and {second.name} within "
                             f"{abs(gap):.1%} of each other (under {tie:.0%})")
    if gap > 0:
        return Verdict(True, f"agree: speclens-bench also ranks {first.name} ahead of {second.name}, by {gap:.1%}")
    return Verdict(False, f"disagree: speclens-bench ranks {second.name} ahead of {first.name}, by "
                          f"{1 / (1 + gap) - 1:.1%}")


def _candidate_engine(target: str, m: Measured, device: str | None):
    """The pair speclens-bench loads for this candidate: the target with the draft model, or the target alone for
    the n-gram drafter (what the finder's "Load this pair" loads)."""
    return bench.load(target, m.candidate.path, device)


def _mode(m: Measured) -> str:
    return "ngram" if m.candidate.is_ngram else "draft"


def bench_both(target: str, top: list[Measured], chats: list[list[dict[str, str]]], max_new_tokens: int,
               repeats: int, device: str | None) -> list[dict]:
    """Both candidates measured as speclens-bench measures a mode, prompt by prompt in turn: plain decoding, then the
    candidate's mode at its best K, on the candidate's own load. Returns per candidate its totals."""
    sampling = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, seed=0)
    engines = []
    for m in top:
        print(f"loading {m.candidate.name}...", file=sys.stderr, flush=True)
        engine = _candidate_engine(target, m, device)
        ids = [engine.encode_chat(list(c)) for c in chats]
        for _ in engine.generate(ids[0], sampling.with_(max_new_tokens=4), SpecParams(enabled=False)):
            pass  # first-call allocations stay out of the timings, as speclens-bench's warm-up does
        engine.reset()
        engines.append((engine, ids))
    totals = [{"plain_tokens": 0, "plain_s": 0.0, "tokens": 0, "decode_s": 0.0, "drafted": 0, "accepted": 0,
               "identical": True, "replies": 0} for _ in top]
    turn = 0
    for rep in range(repeats):
        for p in range(len(chats)):
            order = [0, 1] if turn % 2 == 0 else [1, 0]  # who goes first alternates, so neither always runs fresh
            turn += 1
            for i in order:
                engine, ids = engines[i]
                m, t = top[i], totals[i]
                print(f"\rrepeat {rep + 1}/{repeats}, prompt {p + 1}/{len(chats)}: {m.candidate.name}"[:100].ljust(100),
                      end="", file=sys.stderr, flush=True)
                plain = bench.run_mode(engine, [ids[p]], "plain", 0, sampling)
                spec = bench.run_mode(engine, [ids[p]], _mode(m), m.best_k, sampling)
                t["plain_tokens"] += plain.new_tokens
                t["plain_s"] += plain.new_tokens / plain.tokens_per_s if plain.tokens_per_s > 0 else 0.0
                t["tokens"] += spec.new_tokens
                t["decode_s"] += spec.new_tokens / spec.tokens_per_s if spec.tokens_per_s > 0 else 0.0
                t["drafted"] += spec.drafted_tokens
                t["accepted"] += spec.accepted_tokens
                t["identical"] = t["identical"] and spec.outputs == plain.outputs
                t["replies"] += 1
    print(file=sys.stderr)
    del engines
    gc.collect()
    out = []
    for m, t in zip(top, totals):
        plain_rate = t["plain_tokens"] / t["plain_s"] if t["plain_s"] > 0 else 0.0
        rate = t["tokens"] / t["decode_s"] if t["decode_s"] > 0 else 0.0
        out.append({"name": m.candidate.name, "path": m.candidate.path, "mode": _mode(m), "k": m.best_k,
                    "tokens_per_s": rate, "plain_tokens_per_s": plain_rate,
                    "speedup": rate / plain_rate if plain_rate > 0 else 0.0,
                    "acceptance": t["accepted"] / t["drafted"] if t["drafted"] else None,
                    "identical_to_plain": t["identical"], "replies": t["replies"]})
    return out


def side_by_side(top: list[Measured], benched: list[dict]) -> str:
    """The two rankings, each in its own order, with their figures."""
    by_bench = sorted(benched, key=lambda b: b["speedup"], reverse=True)

    def cell(name: str, speedup: float, k: int, rate: float) -> str:
        return f"{name[:32]:<32} {speedup:5.2f}x  K={k:<2} {rate:7.2f} t/s"

    width = len(cell("", 0.0, 0, 0.0))
    lines = [f"{'':<4}{'finder (draft_finder)':<{width}}  |  speclens-bench (run_mode)"]
    for rank, (m, b) in enumerate(zip(top, by_bench), 1):
        left = cell(m.candidate.name, m.speedup, m.best_k, m.tokens_per_s)
        right = cell(b["name"], b["speedup"], b["k"], b["tokens_per_s"])
        lines.append(f"{rank:<4}{left}  |  {right}")
    lines.append("speedup: decode rate over plain decoding's in the same load; t/s: the candidate's decode rate")
    for b in benched:
        if not b["identical_to_plain"]:
            lines.append(f"BUG: {b['name']}'s greedy output differed from plain decoding's under speclens-bench")
    return "\n".join(lines)


def _fail(reason: str) -> int:
    print(f"finder_agreement: {reason}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", help="folder, .gguf or HF-cache repo id (default: the embedded target)")
    ap.add_argument("--candidates", nargs="+", metavar="MODEL", help="the drafts the finder tries (default: every "
                    "model speclens-models lists)")
    ap.add_argument("--prompts", help="JSONL in speclens-bench's or Spec-Bench's format (default: the finder's "
                    "three built-in prompts)")
    ap.add_argument("--budget", type=float, default=FinderConfig.time_budget_s,
                    help="the finder's time budget in seconds, loads included")
    ap.add_argument("--max-new-tokens", type=int, default=FinderConfig.max_new_tokens)
    ap.add_argument("--k", default=",".join(map(str, FinderConfig.ks)), help="the K values the finder tries")
    ap.add_argument("--repeats", type=int, default=1, help="how many times the bench side goes over the prompts")
    ap.add_argument("--device", default=None)
    results.add_arguments(ap)
    a = ap.parse_args(argv)
    try:
        ks = tuple(int(x) for x in a.k.split(",") if x.strip())
        cfg = FinderConfig(a.max_new_tokens, ks, a.budget, device=a.device)
    except ValueError as e:
        return _fail(f"--k/--max-new-tokens/--budget: {e}")
    if not 1 <= a.repeats <= 100:
        return _fail(f"--repeats must be in 1..100, got {a.repeats}")
    try:
        chats = draft_finder.check_prompts(draft_finder.prompts_from_rows(read_prompts(a.prompts)) if a.prompts
                                           else [list(p) for p in BUILTIN_PROMPTS])
    except (ValueError, OSError) as e:
        return _fail(f"{a.prompts}: {e}")

    def progress(stage: str, fraction: float) -> None:
        print(f"\r[{fraction:4.0%}] {stage[:70]:<70}", end="", file=sys.stderr, flush=True)

    found = draft_finder.find_drafts(a.target, a.candidates, chats, cfg, progress)
    print(file=sys.stderr)
    print(draft_finder.table(found), flush=True)
    top = found.measured[:2]
    if len(top) < 2:
        return _fail(f"the finder measured {len(top)} candidate(s); comparing its ranking needs two (a larger "
                     "--budget, or more candidates)")
    if any(not m.identical_to_plain for m in top):
        return _fail("a candidate's greedy output differed from plain decoding's in the finder: a bug, not a "
                     "ranking to compare")
    benched = bench_both(str(found.target.path), top, chats, a.max_new_tokens, a.repeats, a.device)
    print(side_by_side(top, benched))
    v = verdict([Ranked(m.candidate.name, m.speedup, m.best_k) for m in top],
                [Ranked(b["name"], b["speedup"], b["k"]) for b in benched])
    print(v.sentence, flush=True)
    finder_fig = [{"name": m.candidate.name, "path": m.candidate.path, "k": m.best_k, "speedup": m.speedup,
                   "tokens_per_s": m.tokens_per_s, "plain_tokens_per_s": m.plain_tokens_per_s,
                   "predicted": m.predicted, "alpha": m.alpha, "c": m.c} for m in top]
    results.record(a, "scripts.bench.finder_agreement",
                   {"target": found.target.name, "prompts": len(chats), "max_new_tokens": a.max_new_tokens,
                    "ks": list(cfg.ks), "repeats": a.repeats, "finder": finder_fig, "bench": benched,
                    "agree": v.agree, "verdict": v.sentence, "tie": TIE}, device=a.device)
    return 0 if all(b["identical_to_plain"] for b in benched) else 1


if __name__ == "__main__":
    sys.exit(main())
