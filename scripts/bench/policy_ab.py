"""Two settings of the hybrid drafter's policy on the real engine, in one process, beside fixed modes.

    python -m scripts.bench.policy_ab --set SWITCH_MARGIN=0.1 [--prompts P] [--repeats 3] [--fixed draft:4,ngram:4]

A is the policy as committed; B is the same with `--set` constants of engine.spec.policy (or of
engine.spec.round_costs, the costs it prices with) changed for its replies only. Both run the app's default
settings; the fixed modes (`--fixed`, drafter:K with the app's stop rule) say what "best fixed mode" is on the same
prompts. Each variant runs on its own engine (Engine.twin: the same weights, its own caches and policy state), and
the variants take turns round by round (engine.tools.in_step), B's constants set for B's rounds only, so that the
host's drift (a third from one minute to the next on these hosts) touches every variant alike: the way
performance.md asks a change to be measured, for the policy. The replay (policy_replay.py) judges a change in
seconds but models a quiet machine from medians (a change it favoured on four kinds ran summarization 8.5% slower in
such a run), so confirm a change here, then with `speclens-bench`. Reported per prompt kind: each variant's decode
rate (tokens over decode seconds, as speclens-bench counts them), B / A, and A and B over the best fixed mode;
greedy, so every reply must be plain's.
"""
from __future__ import annotations

import argparse
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from engine.api.config import APP_DEFAULTS, SamplingParams, SpecParams
from engine.api.events import Summary
from engine.spec import policy, round_costs
from engine.tools import results
from engine.tools.bench import Ask, load, mode_spec, warm_up
from engine.tools.in_step import run_in_step
from engine.tools.specbench import Tally, interval, paired_ratio, read_questions

PROMPTS = Path(__file__).resolve().parents[2].parent / "shared" / "bench" / "specbench_public.jsonl"


@dataclass(frozen=True)
class Prompt:
    id: str
    kind: str
    ids: list[int]


@dataclass(frozen=True)
class Variant:
    name: str
    spec: SpecParams
    sets: tuple[tuple[str, object], ...] = ()  # policy constants changed for this variant's replies


def owner(name: str):
    """The module that defines the policy's constant `name`: engine.spec.round_costs for the costs' priors and
    windows, engine.spec.policy for the rest (None if neither). The policy reads round_costs' constants through that
    module, so setting one there reaches every reader."""
    if not name.isupper():
        return None
    return next((m for m in (round_costs, policy) if hasattr(m, name)), None)


def parse_sets(items: Sequence[str]) -> tuple[tuple[str, object], ...]:
    """NAME=VALUE pairs as the policy's constants (owner), each converted to the constant's own type."""
    out = []
    for item in items:
        name, sep, value = item.partition("=")
        module = owner(name) if sep else None
        if module is None:
            raise ValueError(f"{item!r}: not NAME=VALUE for a constant of engine.spec.policy or round_costs")
        kind = type(getattr(module, name))
        try:
            out.append((name, kind(value)))
        except ValueError:
            raise ValueError(f"{item!r}: {name} takes a {kind.__name__}") from None
    return tuple(out)


@contextmanager
def constants(sets: Sequence[tuple[str, object]]) -> Iterator[None]:
    """The policy's constants as `sets` says, each in its owner module, restored afterwards whatever happens."""
    saved = [(owner(name), name, getattr(owner(name), name)) for name, _ in sets]
    try:
        for name, value in sets:
            setattr(owner(name), name, value)
        yield
    finally:
        for module, name, value in saved:
            setattr(module, name, value)


@dataclass(frozen=True)
class Reply:
    """One prompt in one variant, as engine.tools.bench.Ask reads a mode's run: its settings, and where a finished
    request goes."""

    prompt: Prompt
    variant: Variant
    sampling: SamplingParams
    done: Callable[[Prompt, Variant, list, Summary], None]

    @property
    def spec(self) -> SpecParams:
        return self.variant.spec

    def record(self, rounds: list, summary: Summary, question: object = None) -> None:
        self.done(self.prompt, self.variant, rounds, summary)


def run(engines: Sequence, prompts: Sequence[Prompt], variants: Sequence[Variant], repeats: int, max_new_tokens: int,
        say: Callable[[str], None] = print) -> tuple[dict[str, dict[str, Tally]], bool]:
    """Every prompt `repeats` times in every variant, variant i on engines[i], the variants taking turns round by
    round with each one's constants set for its own rounds; each prompt starts one variant further along (ties).
    Returns each variant's tallies per kind, and whether every reply equalled the first reply to its prompt."""
    if len(engines) != len(variants):
        raise ValueError(f"{len(variants)} variants need as many engines, not {len(engines)}")
    greedy = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens)
    tallies: dict[str, dict[str, Tally]] = {v.name: {} for v in variants}
    first: dict[str, list[int]] = {}
    identical = True

    def done(p: Prompt, v: Variant, rounds: list, summary: Summary) -> None:
        nonlocal identical
        tallies[v.name].setdefault(p.kind, Tally()).add(rounds, summary)
        identical &= first.setdefault(p.id, list(summary.token_ids)) == list(summary.token_ids)
        say(f"  {p.id} {v.name}: {summary.tokens_per_s:.2f} tok/s")

    lanes = list(zip(engines, variants))
    turn = 0
    for _ in range(repeats):
        for p in prompts:
            order = lanes[turn % len(lanes):] + lanes[: turn % len(lanes)]
            run_in_step([Ask(Reply(p, v, greedy, done), e, p.ids) for e, v in order],
                        around=lambda i, order=order: constants(order[i][1].sets))
            turn += 1
    return tallies, identical


def rate(t: Tally) -> float:
    return t.new_tokens / t.decode_s if t.decode_s > 0 else 0.0


def compare(tallies: dict[str, dict[str, Tally]], fixed: Sequence[str]) -> dict[str, dict[str, float]]:
    """Per kind: each variant's rate, B / A with its 90% paired bootstrap interval, and A and B over the best of the
    fixed modes."""
    out = {}
    for kind in tallies["A"]:
        rates = {name: rate(by_kind[kind]) for name, by_kind in tallies.items()}
        best = max((rates[f] for f in fixed), default=0.0)
        row = {**rates, "B / A": rates["B"] / rates["A"]}
        # pairs: the same reply in one turn of the variants (drift that moves a whole repeat is underrated)
        if (paired := paired_ratio(tallies["B"][kind], tallies["A"][kind])) is not None:
            spread = interval(*paired)
            row |= {"B / A low": spread["low"], "B / A high": spread["high"]}
        if best:
            row |= {"A / best fixed": rates["A"] / best, "B / best fixed": rates["B"] / best}
        out[kind] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                    help="a constant of engine.spec.policy or round_costs for variant B (repeatable)")
    ap.add_argument("--prompts", default=str(PROMPTS),
                    help="a prompts file, this project's format or Spec-Bench's (a question asks its first turn)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--fixed", default="draft:4,ngram:4", help="fixed modes beside the two, drafter:K, comma-separated")
    results.add_arguments(ap)
    a = ap.parse_args()
    try:
        sets = parse_sets(a.set)
        fixed = [(d, int(k)) for d, _, k in (f.partition(":") for f in a.fixed.split(",") if f)]
        questions = read_questions(a.prompts)
    except ValueError as e:
        ap.error(str(e))
    if not sets:
        ap.error("nothing to compare: give variant B with --set NAME=VALUE")
    engine = load(None, None, None)
    first_turn = lambda q: [{"role": "user", "content": q.turns[0]}]  # noqa: E731
    prompts = [Prompt(q.id, q.category, engine.encode_chat(list(q.messages) or first_turn(q))) for q in questions]
    stop = APP_DEFAULTS.spec_params().stop_below
    variants = [Variant("A", mode_spec("default", 0)), Variant("B", mode_spec("default", 0), sets),
                *(Variant(f"{d} K{k}", mode_spec(d, k, stop)) for d, k in fixed)]
    engines = [engine] + [engine.twin() for _ in variants[1:]]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=a.max_new_tokens)
    for e in engines:
        warm_up(e, questions[0], greedy)
    tallies, identical = run(engines, prompts, variants, a.repeats, a.max_new_tokens)
    table = compare(tallies, [v.name for v in variants[2:]])
    names = [v.name for v in variants]
    print("B: " + ", ".join(f"{n}={v}" for n, v in sets))
    print(f"{'kind':16s}" + "".join(f"{n:>12s}" for n in names) + f"{'B / A (90%)':>22s}{'A/best':>8s}{'B/best':>8s}")
    for kind, row in table.items():
        interval = f" [{row['B / A low']:.3f}, {row['B / A high']:.3f}]" if "B / A low" in row else ""
        print(f"{kind:16s}" + "".join(f"{row[n]:12.2f}" for n in names) + f"{row['B / A']:.3f}{interval}".rjust(22)
              + f"{row.get('A / best fixed', 0):8.3f}{row.get('B / best fixed', 0):8.3f}")
    print("every reply equalled the first to its prompt:", "yes" if identical else "NO")
    figures = {"b": dict(sets), "repeats": a.repeats, "max_new_tokens": a.max_new_tokens, "identical": identical,
               "kinds": table}
    results.record(a, "scripts.bench.policy_ab", figures)


if __name__ == "__main__":
    main()
