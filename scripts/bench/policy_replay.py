"""The drafting modes replayed on recorded replies: what the hybrid's policy chooses, priced without the noise of timing.

    python -m scripts.bench.policy_replay record --prompts ../shared/bench/specbench_public.jsonl --out trace.json
    python -m scripts.bench.policy_replay replay trace.json [--noise 0.1]

Under greedy decoding a reply is the target's greedy text whichever drafter drafts it, and what a drafter proposes at
a position depends only on the text before it: the draft model's greedy tokens and its confidence in each (what the
stop rule reads), and the n-gram lookup's continuation. So `record` keeps, per prompt, the plain greedy reply and the
draft model's 4-token greedy draft at every position of it, and times this machine's passes: target passes of width
1-5, drafting 1-4 tokens, the first drafting pass after a lag of 0-63 ids (a catch-up past 16), and each round's work
besides its passes. `replay` then runs every mode's rounds over those replies, the hybrid through the real policy
(engine.spec.policy) and the real n-gram drafter, each round priced by the measured costs (`--noise`: each time scaled
by a lognormal factor of that spread, seeded, as a machine's timings scatter). The modes then differ only by what
they choose, so a policy change is judged in seconds; `speclens-bench` stays the measurement (the replay models a
quiet machine and leaves out everything the costs do not hold).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass, field

import torch

from engine.api.config import SamplingParams, SpecParams
from engine.spec import policy, round_costs
from engine.spec.drafters.hybrid import ngram_offer
from engine.spec.drafters.model import lag_split
from engine.spec.drafters.ngram import NGramDrafter
from scripts.bench.policy_ab import constants, parse_sets

K_TRACE = 4  # the draft model's greedy draft recorded at every position: the modes' largest K
LAGS = (0, 1, 3, 7, 15, 31, 63)  # draft cache lags timed: the first drafting pass reads lag + 1 ids, or a catch-up


# ---- record ---------------------------------------------------------------------------------------------------
def _median_ms(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0


def record(a: argparse.Namespace) -> None:
    from engine.tools.bench import load, mode_spec

    engine = load(None, None, None)
    rows = [json.loads(line) for line in open(a.prompts, encoding="utf-8") if line.strip()]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=a.max_new_tokens)
    md = engine.model_drafter
    prompts, verify, draft, other = [], {w: [] for w in range(1, K_TRACE + 2)}, {d: [] for d in range(1, K_TRACE + 1)}, []
    for n, row in enumerate(rows):
        ids = engine.encode_chat(row["messages"])
        engine.reset()
        *rounds, summary = engine.generate(ids, greedy, SpecParams(enabled=False))
        reply = list(summary.token_ids)
        # The machine's pass times: plain steps, and the draft model at K 1-4 drafting every token (stop rule off).
        for ev in rounds[1:]:
            verify[1].append(ev.verify_ms)
        for k in range(1, K_TRACE + 1):
            engine.reset()
            *spec_rounds, _ = engine.generate(ids, greedy, mode_spec("draft", k))
            last = spec_rounds[0].elapsed_s
            for ev in spec_rounds[1:]:
                d = len(ev.drafted)
                if d == k:
                    verify[d + 1].append(ev.verify_ms)
                    draft[d].append(ev.draft_ms)
                    other.append((ev.elapsed_s - last) * 1e3 - ev.draft_ms - ev.verify_ms)
                last = ev.elapsed_s
        # The draft model's greedy draft at every position of the reply, with its confidence in each token.
        md.configure(SpecParams(stop_below=0.0))
        drafts = []
        for i in range(len(reply)):
            p = md.propose(ids + reply[:i], K_TRACE, greedy, None)
            toks = p.tokens.tolist()
            conf = [float(torch.softmax(p.logits[j].float(), -1)[t]) for j, t in enumerate(toks)]
            drafts.append((toks, conf))
        prompts.append({"id": row["id"], "kind": row.get("kind", ""), "prompt": ids, "reply": reply, "drafts": drafts})
        print(f"  {n + 1}/{len(rows)} {row['id']}: {len(reply)} tokens", file=sys.stderr)
    lag_ms = {}
    ids = prompts[0]["prompt"] + prompts[0]["reply"]
    for lag in LAGS:  # the first drafting pass after a lag: it reads lag + 1 ids, or catches up first
        times = []
        for _ in range(5):
            md.rollback(ids[: len(ids) - lag])
            t0 = time.perf_counter()
            md.propose(ids, 1, greedy, None)
            times.append((time.perf_counter() - t0) * 1e3)
        lag_ms[lag] = _median_ms(times)
    costs = {"verify_ms": {w: _median_ms(v) for w, v in verify.items()},
             "draft_ms": {d: _median_ms(v) for d, v in draft.items()},
             "first_pass_ms": lag_ms, "round_other_ms": _median_ms(other)}
    json.dump({"max_new_tokens": a.max_new_tokens, "costs": costs, "prompts": prompts}, open(a.out, "w"))
    print(json.dumps(costs, indent=1))


# ---- replay ---------------------------------------------------------------------------------------------------
@dataclass
class Costs:
    """A quiet machine's times (seconds), from `record`."""

    verify: dict[int, float]  # a target pass of each width
    draft: dict[int, float]  # drafting d tokens with the cache a round behind at most (the engine's draft_ms)
    first: dict[int, float]  # the first drafting pass after a lag (catch-up included past MAX_ROUND_LAG)
    other: float  # a round's work besides its passes
    noise: float = 0.0
    rng: random.Random = field(default_factory=lambda: random.Random(0))

    @staticmethod
    def of(trace: dict, noise: float, seed: int) -> Costs:
        c = trace["costs"]
        secs = lambda d: {int(key): ms / 1e3 for key, ms in d.items()}  # noqa: E731
        return Costs(secs(c["verify_ms"]), secs(c["draft_ms"]), secs(c["first_pass_ms"]), c["round_other_ms"] / 1e3,
                     noise, random.Random(seed))

    def _jitter(self, s: float) -> float:
        return s * math.exp(self.rng.gauss(0.0, self.noise)) if self.noise else s

    def verify_s(self, width: int) -> float:
        return self._jitter(_interpolate(self.verify, width))

    def extra_s(self, lag: int) -> float:
        """What a lag adds to the first drafting pass (its catch-up included)."""
        return _interpolate(self.first, lag) - self.first[0]

    def draft_s(self, drafted: int, lag: int) -> float:
        return self._jitter(_interpolate(self.draft, drafted) + self.extra_s(lag))


def _interpolate(table: dict[int, float], x: int) -> float:
    """table at x, linear between the nearest keys (and beyond the last two)."""
    keys = sorted(table)
    if x in table:
        return table[x]
    lo = max((k for k in keys if k < x), default=keys[0])
    hi = min((k for k in keys if k > x), default=keys[-1])
    if hi == lo:
        lo, hi = keys[-2], keys[-1]
    return table[lo] + (x - lo) * (table[hi] - table[lo]) / (hi - lo)


class Reply:
    """One recorded reply being replayed: the committed length and the draft cache's lag (ModelDrafter._behind:
    committed ids past the cache, besides the last one, which every drafting pass reads)."""

    def __init__(self, p: dict, budget: int) -> None:
        self.prompt, self.reply, self.drafts = p["prompt"], p["reply"], p["drafts"]
        self.budget = budget
        self.done = 0  # reply tokens committed
        self.lag = 0

    @property
    def ids(self) -> list[int]:
        return self.prompt + self.reply[: self.done]

    def room(self) -> int:
        return min(self.budget - self.done - 1, len(self.reply) - self.done)

    def accepted(self, tokens: list[int]) -> int:
        truth = self.reply[self.done : self.done + len(tokens)]
        a = 0
        while a < len(tokens) and a < len(truth) and tokens[a] == truth[a]:
            a += 1
        return a

    def model_draft(self, k: int, stop_below: float) -> list[int]:
        """The draft model's tokens at a ceiling k, under the stop rule as ModelDrafter.propose applies it."""
        toks, conf = self.drafts[self.done]
        out, survive = [], 1.0
        for i in range(min(k, len(toks))):
            out.append(toks[i])
            if stop_below > 0.0 and i + 1 < k:
                survive *= conf[i]
                if survive < stop_below:
                    break
        return out

    def commit(self, drafted: int, accepted: int, by_model: bool) -> int:
        n = min(accepted + 1, len(self.reply) - self.done)
        self.done += n
        # A model round leaves the cache a token behind after a bonus (ModelDrafter: the last draft is not fed);
        # any other round leaves it behind by what it committed.
        self.lag = (1 if accepted == drafted else 0) if by_model else self.lag + n
        return n


@dataclass
class Mode:
    name: str
    drafter: str  # "plain", "draft", "ngram", "hybrid"
    k: int
    stop_below: float = 0.7


def replay_reply(mode: Mode, p: dict, budget: int, costs: Costs, state: policy.PolicyState) -> tuple[int, float, int]:
    """(tokens, seconds, rounds) of one reply in one mode; the first round's tokens and time (it reads the prompt)
    are left out."""
    r = Reply(p, budget)
    ngram = NGramDrafter(0, torch.device("cpu"))  # its point masses are never built here
    seconds, tokens_after_first, rounds = 0.0, 0, 0
    state.start()
    state.model_stops = mode.stop_below > 0
    while r.done < len(r.reply):
        k = min(mode.k, r.room())
        drafter, tokens, draft_s, ceiling = "plain", [], 0.0, 0
        lag = r.lag
        if mode.drafter == "draft" and k >= 1:
            drafter, tokens = "model", r.model_draft(k, mode.stop_below)
            draft_s = costs.draft_s(len(tokens), lag)
        elif mode.drafter == "ngram" and k >= 1:
            tokens = ngram.proposed(r.ids, k)
            drafter = "ngram" if tokens else "plain"
        elif mode.drafter == "hybrid" and k >= 1:
            drafter, tokens, draft_s, ceiling = _hybrid_round(r, ngram, state, k, mode.stop_below, costs)
        verify_s = costs.verify_s(len(tokens) + 1)
        a = r.accepted(tokens)
        if mode.drafter == "hybrid":
            round_costs.observe_pass(state, len(tokens) + 1, verify_s)
            if drafter == "model":
                catchup, fed = lag_split(lag)
                step_s = draft_s - (costs.extra_s(lag) if catchup else 0.0)
                policy.observe_model(state, len(tokens), a, step_s, verify_s, fed, ceiling)
        n = r.commit(len(tokens), a, drafter == "model")
        if mode.drafter in ("ngram", "hybrid"):
            ngram.rollback(r.ids)
        if rounds:
            seconds += draft_s + verify_s + costs.other
            tokens_after_first += n
        rounds += 1
    return tokens_after_first, seconds, rounds


def _hybrid_round(r: Reply, ngram: NGramDrafter, state: policy.PolicyState, k: int, stop_below: float,
                  costs: Costs) -> tuple[str, list[int], float, int]:
    """HybridDrafter.propose over the recorded reply: the lookup, the policy's choice, the chosen drafter's tokens,
    their drafting time and the ceiling they were drafted at."""
    state.measuring = True
    model_lag, fed = lag_split(r.lag)
    match, cont = ngram.lookup(r.ids, k)
    choice = policy.choose(state, ngram_offer(ngram, match, cont), k, model_lag, model_fed=fed)
    if choice.drafter == policy.NGRAM:
        return "ngram", cont[: choice.k], 0.0, choice.k
    if choice.drafter == policy.MODEL:
        tokens = r.model_draft(choice.k, stop_below)
        if model_lag:
            round_costs.observe_catchup(state, model_lag, costs.extra_s(model_lag))
        return "model", tokens, costs.draft_s(len(tokens), r.lag), choice.k
    return "plain", [], 0.0, 0


def replay(a: argparse.Namespace) -> None:
    trace = json.load(open(a.trace))
    modes = [Mode("plain", "plain", 0)]
    for k in (2, 4):
        modes += [Mode(f"draft K{k}", "draft", k), Mode(f"ngram K{k}", "ngram", k, 0.0), Mode(f"hybrid K{k}", "hybrid", k)]
    kinds = sorted({p["kind"] for p in trace["prompts"]})
    rate: dict[str, dict[str, float]] = {}
    for mode in modes:
        costs = Costs.of(trace, a.noise, a.seed)
        state = policy.PolicyState()  # one engine's: its pass times and long run carry over from reply to reply
        per_kind = {kind: [0, 0.0] for kind in kinds}
        for _ in range(a.repeats):
            for p in trace["prompts"]:
                tokens, seconds, _ = replay_reply(mode, p, trace["max_new_tokens"], costs, state)
                per_kind[p["kind"]][0] += tokens
                per_kind[p["kind"]][1] += seconds
        rate[mode.name] = {kind: t / s for kind, (t, s) in per_kind.items()}
    fixed = [m.name for m in modes if m.name not in ("plain", "hybrid K4")]
    print("| kind | " + " | ".join(m.name for m in modes) + " | hybrid K4 / best other |")
    print("| --- |" + " ---: |" * (len(modes) + 1))
    ratios = []
    for kind in kinds:
        best = max(rate[m][kind] for m in fixed)
        ratios.append(rate["hybrid K4"][kind] / best)
        print(f"| {kind} | " + " | ".join(f"{rate[m.name][kind]:.2f}" for m in modes) + f" | {ratios[-1]:.3f} |")
    gm = {m.name: math.exp(statistics.mean(math.log(rate[m.name][k] / rate["plain"][k]) for k in kinds)) for m in modes}
    print("| geomean over plain | " + " | ".join(f"{gm[m.name]:.3f}" for m in modes)
          + f" | {gm['hybrid K4'] / max(gm[m] for m in fixed):.3f} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    rec = sub.add_parser("record")
    rec.add_argument("--prompts", required=True)
    rec.add_argument("--out", required=True)
    rec.add_argument("--max-new-tokens", type=int, default=128)
    rep = sub.add_parser("replay")
    rep.add_argument("trace")
    rep.add_argument("--noise", type=float, default=0.0)
    rep.add_argument("--seed", type=int, default=0)
    rep.add_argument("--repeats", type=int, default=1)
    rep.add_argument("--set", action="append", default=[], metavar="NAME=VALUE",
                     help="a constant of engine.spec.policy or round_costs, for this replay (e.g. FIRST_TRIES=1)")
    a = ap.parse_args()
    try:
        sets = parse_sets(getattr(a, "set", []))
    except ValueError as e:
        ap.error(str(e))
    with constants(sets):
        record(a) if a.cmd == "record" else replay(a)


if __name__ == "__main__":
    main()
