"""How much a benchmark's timing scatters when modes take turns reply by reply, and when round by round.

    python -m scripts.bench.turns_noise --prompts question.jsonl [--per-kind translation=20,qa=20,math_reasoning=8]

The draft model at K 2 runs twice, on two engines (Engine.twin), beside plain decoding: A and B are the same
settings, so every difference between them is the measurement's. Question by question each arrangement runs once
(their order alternating): "reply by reply" asks each mode's reply alone, one mode after another (as speclens-bench
did before engine.tools.in_step); "round by round" runs the three in step. Reported per kind: B / A over the kind,
the standard deviation of the per-reply log ratio B / A (the noise each reply adds to a kind's ratio), and the
draft model's speedup over plain. First turns, greedy, 128 new tokens; every reply must be plain's.
"""
from __future__ import annotations

import argparse
import math
import statistics

from engine.api.config import APP_DEFAULTS, SamplingParams
from engine.tools import results
from engine.tools.bench import Ask, ModeRun, load, warm_up
from engine.tools.in_step import run_in_step
from engine.tools.specbench import Question, per_category, read_questions

ARRANGEMENTS = ("reply by reply", "round by round")


def parse_kinds(text: str) -> dict[str, int]:
    """kind=N pairs, comma-separated."""
    out = {}
    for item in text.split(","):
        kind, sep, n = item.partition("=")
        if not sep or not n.strip().isdigit() or int(n) < 2:
            raise ValueError(f"--per-kind wants kind=N with N >= 2, got {item!r}")
        out[kind.strip()] = int(n)
    return out


def first_turns(questions: list[Question], kinds: dict[str, int]) -> list[Question]:
    """N questions of each kind, evenly spread through the file, their first turns only."""
    spread = per_category(questions, max(kinds.values()))
    out = []
    for kind, n in kinds.items():
        of_kind = [q for q in spread if q.category == kind][:n]
        if len(of_kind) < n:
            raise ValueError(f"the prompts hold {len(of_kind)} questions of kind {kind!r}, not {n}")
        out += [Question(q.id, q.category, turns=q.turns[:1], messages=q.messages) for q in of_kind]
    return out


def summarize(runs: list[ModeRun], kinds: dict[str, int]) -> dict[str, dict[str, float]]:
    """Per kind: B / A, the per-reply log ratio's standard deviation, and A's speedup over plain (runs: A, B,
    plain)."""
    out = {}
    for kind in kinds:
        a, b, plain = (r.categories[kind].per_reply for r in runs)
        logs = [math.log(ta / tb) for (_, ta), (_, tb) in zip(a, b)]  # seconds: B faster -> ratio above 1
        out[kind] = {"replies": len(a), "b_over_a": sum(t for _, t in a) / sum(t for _, t in b),
                     "per_reply_log_sd": statistics.stdev(logs),
                     "speedup": sum(t for _, t in plain) / sum(t for _, t in a)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", required=True, help="Spec-Bench's question.jsonl, or a file in this project's format")
    ap.add_argument("--per-kind", default="translation=20,qa=20,math_reasoning=8", help="kind=N, comma-separated")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    results.add_arguments(ap)
    a = ap.parse_args()
    try:
        kinds = parse_kinds(a.per_kind)
        questions = first_turns(read_questions(a.prompts), kinds)
    except ValueError as e:
        ap.error(str(e))
    base = load(None, None, None)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=a.max_new_tokens)
    stop = APP_DEFAULTS.spec_params().stop_below
    engines = [base, base.twin(), base.twin()]
    for e in engines:
        warm_up(e, questions[0], greedy)

    def runs() -> list[ModeRun]:
        return [ModeRun("draft", 2, greedy, stop, engine=engines[0]), ModeRun("draft", 2, greedy, stop,
                engine=engines[1]), ModeRun("plain", 1, greedy, engine=engines[2])]

    arranged = {name: runs() for name in ARRANGEMENTS}
    for i, q in enumerate(questions):
        for name in ARRANGEMENTS if i % 2 == 0 else ARRANGEMENTS[::-1]:
            rs = arranged[name]
            order = rs[i % 3:] + rs[: i % 3]
            if name == "reply by reply":
                for r in order:
                    run_in_step([Ask(r, r.engine, q)])
            else:
                run_in_step([Ask(r, r.engine, q) for r in order])
        print(f"  {i + 1}/{len(questions)} {q.category} {q.id}", flush=True)
    outputs = [out for rs in arranged.values() for r in rs for out in r.outputs]
    identical = all(out == arranged["reply by reply"][2].outputs[j % len(questions)]
                    for j, out in enumerate(outputs))
    table = {name: summarize(rs, kinds) for name, rs in arranged.items()}
    print(f"{'arrangement':16s}{'kind':16s}{'replies':>8s}{'B / A':>8s}{'sd per reply':>14s}{'draft K2 / plain':>18s}")
    for name, rows in table.items():
        for kind, row in rows.items():
            print(f"{name:16s}{kind:16s}{row['replies']:8d}{row['b_over_a']:8.3f}{row['per_reply_log_sd']:14.3f}"
                  f"{row['speedup']:18.3f}")
    print("every reply equalled plain's:", "yes" if identical else "NO")
    results.record(a, "scripts.bench.turns_noise", {"max_new_tokens": a.max_new_tokens, "identical": identical,
                                                     "arrangements": table})


if __name__ == "__main__":
    main()
