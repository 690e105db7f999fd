"""What speclens-bench measured and reports once its modes have run (engine/tools/bench.py runs them): each mode's
Result; the modes' table, the per-category one (Spec-Bench's figures), the default against the fastest other mode,
whether greedy modes kept plain decoding's tokens, and the JSON those come from."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from engine.tools import specbench
from engine.tools.specbench import Tally


@dataclass
class Result:
    mode: str
    k: int
    temperature: float
    # decode rate: the target's and the draft's prompt prefills left out, as llama.cpp does; the draft model's later
    # catch-ups on text other drafters committed stay in (specbench.decode_seconds)
    tokens_per_s: float
    new_tokens: int
    acceptance_rate: float  # accepted / drafted
    mean_accepted_length: float  # tokens committed per round (accepted drafts + correction/bonus)
    seconds: float
    rounds: int
    e2e_tokens_per_s: float = 0.0  # wall clock from request to last token, everything included
    stop_below: float = 0.0
    adaptive: bool = False
    drafted_tokens: int = 0
    accepted_tokens: int = 0
    alpha: float | None = None  # per-token acceptance: accepted / (accepted + rejections)
    draft_ms_per_token: float | None = None  # drafting time per drafted token (the draft model's prefill left out)
    c: float | None = None  # draft_ms_per_token / the plain mode's ms per step (when plain ran)
    verify_ms_by_width: dict[int, float] = field(default_factory=dict)  # mean verify pass ms by K + 1
    pass_steps: dict[int, float] = field(default_factory=dict)  # the same in plain steps (when plain ran)
    outputs: list[list[int]] = field(default_factory=list)
    categories: dict[str, Tally] = field(default_factory=dict)  # the same replies by question category
    per_position_acceptance: list[float] = field(default_factory=list)  # of the rounds drafting position i


def relate_to_plain(results: list[Result]) -> None:
    """c and the pass costs in plain steps, for every mode, once the plain mode's step time is known."""
    plain = next((r for r in results if r.mode == "plain"), None)
    step = plain.verify_ms_by_width.get(1) if plain else None
    if not step:
        return
    for r in results:
        r.pass_steps = {w: ms / step for w, ms in r.verify_ms_by_width.items()}
        if r.draft_ms_per_token is not None and r.mode == "draft":  # the hybrid's n-gram rounds cost ~0
            r.c = r.draft_ms_per_token / step


def report(results: list[Result], greedy: bool, by_category: bool) -> dict:
    """Print the modes' table (and, by_category, the per-category one) and whether greedy modes kept plain's
    tokens; the JSON's "results", "categories" and "identical_to_plain"."""
    relate_to_plain(results)
    print(table(results))
    identity = same_as_plain(results) if greedy else {}
    if identity:
        print("greedy output identical to plain: " + ", ".join(f"{m} {'yes' if ok else 'NO'}"
                                                                 for m, ok in identity.items()))
    categories = category_figures(results)
    tallies = {label(r): r.categories for r in results if r.categories}
    versus = specbench.versus_best(tallies, "default", "plain") if by_category else {}
    if by_category:
        print(category_table(categories))
    if versus:
        print(versus_table(versus))
    per_reply = {m: {c: [[n, round(s, 4)] for n, s in t.per_reply] for c, t in cats.items()}
                 for m, cats in tallies.items()}
    return {"results": [result_json(r) for r in results], "categories": categories, "identical_to_plain": identity,
            "default_vs_best": versus, "per_reply": per_reply}


def versus_table(versus: dict[str, dict]) -> str:
    """The default's rate over the fastest other mode's, and over plain's, per category, with bootstrap intervals."""
    lo, hi = (round(q * 100) for q in specbench.INTERVAL)
    lines = [f"default / fastest other mode, and / plain, on the same replies ({lo}-{hi}% bootstrap interval):"]
    for c, v in versus.items():
        p, fair = v.get("plain"), v.get("held_out")
        over_plain = f"  / plain {p['ratio']:.3f} [{p['low']:.3f}, {p['high']:.3f}]" if p else ""
        held = f"  picked on other replies {fair:.3f}" if fair is not None else ""
        lines.append(f"  {c:<16}{v['ratio']:>6.3f}  [{v['low']:.3f}, {v['high']:.3f}]  fastest other: {v['best']:<12}"
                     + over_plain + held)
    return "\n".join(lines)


def mode_label(mode: str, k: int) -> str:
    """A mode as the bench names it in tables and JSON keys: "plain", "default", "draft K=4"."""
    return mode if mode in ("plain", "default") else f"{mode} K={k}"


def label(r: Result) -> str:
    return mode_label(r.mode, r.k)


def result_json(r: Result) -> dict:
    d = asdict(r)
    d["categories"] = {c: t.figures(None) for c, t in r.categories.items()}
    return d


def same_as_plain(results: list[Result]) -> dict[str, bool]:
    """Under greedy, whether each mode's tokens are plain decoding's, reply by reply (empty without plain)."""
    plain = next((r for r in results if r.mode == "plain"), None)
    if plain is None:
        return {}
    return {label(r): r.outputs == plain.outputs for r in results if r is not plain}


def category_figures(results: list[Result]) -> dict[str, dict[str, dict]]:
    """Per category, then "overall", each mode's figures (Spec-Bench's and vLLM's: rate, speedup over plain in the
    same run, mean accepted length, acceptance, acceptance per position). "overall" sums every reply; its speedup is
    also given as the geometric mean of the categories' (Spec-Bench's leaderboard averages over categories)."""
    plain = next((r for r in results if r.mode == "plain"), None)
    out: dict[str, dict[str, dict]] = {}
    for c in sorted({c for r in results for c in r.categories}):
        base = plain.categories.get(c) if plain is not None else None
        out[c] = {label(r): r.categories[c].figures(base) for r in results if c in r.categories}
    overall: dict[str, dict] = {}
    for r in results:
        if not r.categories:
            continue
        total = Tally()
        for t in r.categories.values():
            total.merge(t)
        base = Tally()
        if plain is not None:
            for t in plain.categories.values():
                base.merge(t)
        figures = total.figures(base if plain is not None else None)
        speedups = [out[c][label(r)]["speedup"] for c in out if label(r) in out[c]]
        speedups = [s for s in speedups if s]
        figures["speedup_geomean"] = round(math.prod(speedups) ** (1 / len(speedups)), 4) if speedups else None
        overall[label(r)] = figures
    if overall:
        out["overall"] = overall
    return out


def category_table(categories: dict[str, dict[str, dict]]) -> str:
    """tok/s, speedup over plain and mean accepted length per category and mode."""
    modes = list(dict.fromkeys(m for per in categories.values() for m in per))
    head = f"{'category':<16}" + "".join(f"{m:>22}" for m in modes)
    lines = [head, f"{'':<16}" + "".join(f"{'tok/s  speedup  tau':>22}" for _ in modes)]
    for c, per in categories.items():
        cells = []
        for m in modes:
            f = per.get(m)
            if f is None:
                cells.append(f"{'-':>22}")
                continue
            sp = f"{f['speedup']:.2f}x" if f.get("speedup") else "-"
            cells.append(f"{f['tokens_per_s']:>8.2f}{sp:>8}{f['mean_accepted_length']:>6.2f}")
        lines.append(f"{c:<16}" + "".join(cells))
    overall = categories.get("overall", {})
    if overall:
        lines.append(f"{'geomean speedup':<16}" + "".join(
            f"{(str(overall[m]['speedup_geomean']) + 'x') if overall.get(m, {}).get('speedup_geomean') else '-':>22}"
            for m in modes))
    return "\n".join(lines)


def table(results: list[Result]) -> str:
    base = next((r.tokens_per_s for r in results if r.mode == "plain"), None)
    lines = [f"{'mode':<7}{'K':>3}{'temp':>6}{'tok/s':>8}{'speedup':>9}{'accept':>8}{'tok/round':>10}{'tokens':>8}"]
    for r in results:
        speed = f"{r.tokens_per_s / base:.2f}x" if base else "-"
        lines.append(f"{r.mode:<7}{r.k:>3}{r.temperature:>6.2f}{r.tokens_per_s:>8.2f}{speed:>9}"
                     f"{r.acceptance_rate:>8.2f}{r.mean_accepted_length:>10.2f}{r.new_tokens:>8}")
    return "\n".join(lines)
