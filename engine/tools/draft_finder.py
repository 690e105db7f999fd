"""The draft finder: which local model drafts fastest for a target, measured on this machine and these prompts.

Two stages. The static checks read headers only: a candidate must run here (its family), be smaller than the
target, and speak the target's tokens (the same vocabulary, id for id, and the same BOS/EOS); each one turned down
keeps its reason. Then each compatible candidate, and the n-gram drafter (no model: it drafts from the
conversation itself), is measured: the pair is loaded as the app loads it and each prompt is decoded greedily,
plainly and at each K in turn before the next prompt (every replay from an empty cache, as speclens-bench does;
which setting goes first moves along prompt by prompt, so the machine's drift falls on all). From those replays come
alpha (accepted drafts over decided tests, the geometric MLE), c (a draft step over a target step: draft ms per
drafted token over plain ms per token), the mean accepted length, the measured speedup at the best K (decode rate
over the plain rate measured in the same load) and Leviathan's prediction from that alpha and c beside it.

Measuring is bounded: few tokens per prompt, a time budget checked between rounds, and a cancel checked between
rounds; a replay cut short is dropped, never counted, and so is a prompt some setting did not finish. A candidate that fails to load is reported and skipped.
`find_drafts` returns a FinderResult whose `to_json()` is plain JSON; `main` is `speclens-bench --find-drafts`.
"""
from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.analysis.sweep import SweepRun, run_of
from engine.analysis.theory import theoretical_speedup
from engine.api.config import K_LIMIT, SamplingParams, SpecParams
from engine.api.errors import ModelLoadError
from engine.api.events import RoundEvent, Summary
from engine.api.live import Controls
from engine.tools.draft_candidates import (
    NGRAM_CANDIDATE,
    Candidate,
    Copy,
    Rejected,
    candidates_from,
    describe_target,
    distinct_files,
    static_checks,
)
from engine.tools.prompt_file import read_prompts

if TYPE_CHECKING:
    from engine.io.hub import LocalModel

Progress = Callable[[str, float], None]  # stage text, fraction of the measuring done in [0, 1]
Cancelled = Callable[[], bool]
Messages = list[dict[str, str]]

# A lead smaller than this is within the finder's noise: five runs of 16 tokens a prompt, the settings taking turns
# prompt by prompt, measured the embedded 0.5B draft at 1.03-1.12x on the quiet Zen 3 (docs/models.md)
NEAR_TIE = 1.10
MAX_PROMPTS = 16
MAX_TOKENS = 512
# Short and of different kinds: code repeats its context (the n-gram drafter's case), prose and lists do not.
BUILTIN_PROMPTS: tuple[tuple[dict[str, str], ...], ...] = (
    ({"role": "user", "content": "Write a Python function that returns the n-th Fibonacci number, with a docstring."},),
    ({"role": "user", "content": "Explain in three short sentences why the sky is blue."},),
    ({"role": "user", "content": "List five fruits, one line each, with one fact about each."},),
)


@dataclass(frozen=True)
class FinderConfig:
    """How much each candidate is measured: max_new_tokens per prompt and replay, the K values tried, and the
    time budget for the whole measuring (loads included)."""

    max_new_tokens: int = 48
    ks: tuple[int, ...] = (1, 2, 3, 4, 6)
    time_budget_s: float = 600.0
    seed: int = 0
    device: str | None = None

    def __post_init__(self) -> None:
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) \
                or not 1 <= self.max_new_tokens <= MAX_TOKENS:
            raise ValueError(f"max_new_tokens must be an integer in 1..{MAX_TOKENS}, got {self.max_new_tokens!r}")
        ks = tuple(self.ks)
        if not ks or any(isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= K_LIMIT for k in ks):
            raise ValueError(f"every K must be an integer in 1..{K_LIMIT}, got {list(ks)}")
        object.__setattr__(self, "ks", tuple(sorted(set(ks))))
        if not isinstance(self.time_budget_s, (int, float)) or not 0 < self.time_budget_s < float("inf"):
            raise ValueError(f"the time budget must be a positive number of seconds, got {self.time_budget_s!r}")


@dataclass(frozen=True)
class Measured:
    """One candidate's measurement. speedup: the best K's decode rate over plain decoding's, both measured in the
    same load; predicted: Leviathan's speedup at that K from the measured alpha and c."""

    candidate: Candidate
    speedup: float
    best_k: int
    alpha: float | None
    c: float | None
    mean_accepted_length: float  # tokens committed per round at the best K (accepted drafts + correction/bonus)
    predicted: float | None
    tokens_per_s: float  # at the best K
    plain_tokens_per_s: float
    speedup_by_k: dict[int, float]
    identical_to_plain: bool  # greedy: every reply token for token plain decoding's (it must be)
    note: str = ""  # the time ran out before every K was tried, ...


@dataclass
class FinderResult:
    target: Candidate
    config: FinderConfig
    prompts: int
    measured: list[Measured] = field(default_factory=list)  # fastest first
    rejected: list[Rejected] = field(default_factory=list)  # by the static checks, or failed to load or run
    not_measured: list[Rejected] = field(default_factory=list)  # compatible, but cancelled or out of time first
    copies: list[Copy] = field(default_factory=list)  # the same bytes as a candidate kept: measured once, as that
    cancelled: bool = False
    out_of_time: bool = False
    elapsed_s: float = 0.0

    @property
    def best(self) -> Measured | None:
        return self.measured[0] if self.measured else None

    @property
    def near_tie(self) -> bool:
        """The first two are closer than the finder can tell apart: a separate speclens-bench run decides."""
        return len(self.measured) > 1 and self.measured[0].speedup < NEAR_TIE * self.measured[1].speedup

    def to_json(self) -> dict[str, Any]:
        def cand(c: Candidate) -> dict[str, Any]:
            return {"name": c.name, "path": c.path, "source": c.source, "family": c.family, "params_b": c.params_b,
                    "quant": c.quant or None}

        def figures(m: Measured) -> dict[str, Any]:
            r = {k: _round(getattr(m, k)) for k in ("speedup", "alpha", "c", "mean_accepted_length", "predicted",
                                                     "tokens_per_s", "plain_tokens_per_s")}
            return {**cand(m.candidate), **r, "best_k": m.best_k,
                    "speedup_by_k": {str(k): _round(s) for k, s in m.speedup_by_k.items()},
                    "identical_to_plain": m.identical_to_plain, "note": m.note or None}

        cfg = self.config
        return {"target": cand(self.target), "prompts": self.prompts,
                "config": {"max_new_tokens": cfg.max_new_tokens, "ks": list(cfg.ks),
                           "time_budget_s": cfg.time_budget_s, "seed": cfg.seed, "device": cfg.device},
                "measured": [figures(m) for m in self.measured],
                "rejected": [{**cand(r.candidate), "reason": r.reason} for r in self.rejected],
                "not_measured": [{**cand(r.candidate), "reason": r.reason} for r in self.not_measured],
                "copies": [{**cand(c.candidate), "same_as": c.same_as.path, "reason": c.reason} for c in self.copies],
                "near_tie": self.near_tie,
                "cancelled": self.cancelled, "out_of_time": self.out_of_time, "elapsed_s": round(self.elapsed_s, 2)}


def _round(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


# ---- measuring -------------------------------------------------------------------------------------------------

class _Stop(Exception):
    """The measuring stops here: cancelled, or out of time."""


class _Watched(Controls):
    """Controls whose cancel is also the finder's own (a cancel or the deadline), read at the start of every round,
    so a long replay stops within a round."""

    def __init__(self, sampling: SamplingParams, spec: SpecParams, stop: Callable[[], bool]) -> None:
        self._stop = stop
        self._own = False
        super().__init__(sampling, spec)

    @property
    def cancelled(self) -> bool:  # type: ignore[override]
        return self._own or self._stop()

    @cancelled.setter
    def cancelled(self, value: bool) -> None:
        self._own = bool(value)


@dataclass
class _Clock:
    """The finder's progress and stops: replays done of those planned, the deadline, the user's cancel."""

    progress: Progress
    cancelled: Cancelled
    deadline: float
    total: int
    done: int = 0
    why: str = ""  # "cancelled" or "out of time", once stopped

    def stop_now(self) -> bool:
        if not self.why:
            if self.cancelled():
                self.why = "cancelled"
            elif time.monotonic() > self.deadline:
                self.why = "out of time"
        return bool(self.why)

    def check(self) -> None:
        if self.stop_now():
            raise _Stop(self.why)

    def tell(self, stage: str, part: float = 0.0) -> None:
        """part: how much of the running replay is done, so a slow replay still moves the bar."""
        self.progress(stage, min(1.0, (self.done + part) / self.total) if self.total else 1.0)


def _spec(drafter: str | None, k: int) -> SpecParams:
    """Fixed K, as Leviathan's formula assumes: no adaptive K, no early stop."""
    if drafter is None:
        return SpecParams(enabled=False)
    return SpecParams(enabled=True, drafter=drafter, k=k, k_max=max(k, 1), adaptive=False, stop_below=0.0)


def _replay(engine, ids: list[int], drafter: str | None, k: int, sampling: SamplingParams,
            clock: _Clock) -> SweepRun:
    """One prompt decoded from an empty cache (as a separate benchmark run starts). Raises _Stop when cut short:
    a replay cut short is dropped, never counted."""
    engine.reset()
    controls = _Watched(sampling, _spec(drafter, k), clock.stop_now)
    rounds: list[RoundEvent] = []
    summary: Summary | None = None
    for item in engine.generate(ids, sampling, controls.spec, controls):
        if isinstance(item, RoundEvent):
            rounds.append(item)
        elif isinstance(item, Summary):
            summary = item
    if summary is None or summary.stop_reason == "cancelled":
        clock.check()
        raise _Stop("cancelled")
    return run_of(drafter, k, summary, rounds)


def _total(drafter: str | None, k: int, parts: list[SweepRun]) -> SweepRun:
    """Replays of several prompts as one SweepRun (the sums; stop reasons joined)."""
    return SweepRun(drafter, k, *(sum(getattr(p, f) for p in parts) for f in (
        "new_tokens", "rounds", "drafted", "accepted", "trials", "decode_s", "draft_ms", "verify_ms")),
        stop_reason=",".join(sorted({p.stop_reason for p in parts})))


def figures(cand: Candidate, plain: SweepRun, runs: list[SweepRun], identical: bool, note: str = "") -> Measured:
    """A candidate's figures from its plain replay and its replays at each K (at least one)."""
    base = plain.tokens_per_s
    by_k = {r.k: (r.tokens_per_s / base if base > 0 else 0.0) for r in runs}
    best = max(runs, key=lambda r: by_k[r.k])
    trials = sum(r.trials for r in runs)
    alpha = sum(r.accepted for r in runs) / trials if trials else None
    drafted = sum(r.drafted for r in runs)
    step_ms = plain.verify_ms / plain.new_tokens if plain.new_tokens else 0.0
    c = sum(r.draft_ms for r in runs) / drafted / step_ms if drafted and step_ms > 0 else None
    predicted = theoretical_speedup(alpha, best.k, c) if alpha is not None and c is not None else None
    return Measured(cand, by_k[best.k], best.k, alpha, c, best.new_tokens / best.rounds if best.rounds else 0.0,
                    predicted, best.tokens_per_s, base, by_k, identical, note)


Setting = tuple[Candidate | None, int]  # (candidate, K); (None, 0): plain decoding


def _measure_load(engine, riders: list[Candidate], prompts: list[list[int]], cfg: FinderConfig,
                  sampling: SamplingParams, clock: _Clock, name: str) -> list[Measured]:
    """Plain decoding and every rider at every K on one loaded engine, prompt by prompt: each prompt is replayed in
    every setting before the next prompt starts, and the setting that goes first moves one along with each prompt,
    so a machine that speeds up or slows down over the minutes weighs on plain decoding and the drafts alike (run
    one setting after another, the same file measured in three loads read 1.00-1.17x). A stop keeps the prompts
    every setting finished; a rider measured on none of them is left out (not measured)."""
    settings: list[Setting] = [(None, 0), *((c, k) for c in riders for k in cfg.ks)]
    parts: dict[Setting, list[SweepRun]] = {s: [] for s in settings}
    complete = 0
    try:
        for i, ids in enumerate(prompts):
            turn = i % len(settings)
            for cand, k in settings[turn:] + settings[:turn]:
                clock.check()
                what = f"{name}: plain decoding" if cand is None else f"{cand.name}: K={k}"
                clock.tell(f"{what} (prompt {i + 1} of {len(prompts)})")
                parts[(cand, k)].append(_replay(engine, ids, cand.drafter if cand else None, k, sampling, clock))
                clock.done += 1
            complete += 1
    except _Stop:
        pass
    if not complete:
        return []
    note = f"{clock.why} after {complete} of {len(prompts)} prompts" if complete < len(prompts) else ""
    plain_parts = parts[(None, 0)][:complete]
    plain = _total(None, 0, plain_parts)
    out = []
    for cand in riders:
        runs = [_total(cand.drafter, k, parts[(cand, k)][:complete]) for k in cfg.ks]
        identical = all(a.token_ids == b.token_ids for k in cfg.ks
                        for a, b in zip(parts[(cand, k)][:complete], plain_parts))
        why = note
        if not identical:
            why = (why + "; " if why else "") + "its output differed from plain decoding: a bug, please report it"
        out.append(figures(cand, plain, runs, identical, why))
    return out


def _load(loader, target: str | None, draft: str | None, cfg: FinderConfig):
    engine = loader(target, draft, device=cfg.device)
    settle = getattr(engine, "settle", None)
    if settle is not None:
        settle(10.0)  # the steady state: the weights on huge pages where the kernel allows
    return engine


def measure_all(target: str, candidates: list[Candidate], prompts: Sequence[Messages], cfg: FinderConfig,
                progress: Progress, cancelled: Cancelled, loader: Callable[..., Any]) -> tuple[
                    list[Measured], list[Rejected], list[Rejected], str]:
    """Load each candidate with the target and measure it; the n-gram drafter rides on the first load that works
    (else on the target alone). Returns measured, failed (with why), not measured (with why) and why it stopped
    early ("" when it did not)."""
    models = [c for c in candidates if not c.is_ngram]
    ngram = next((c for c in candidates if c.is_ngram), None)
    n = len(prompts)
    per_model = n * (1 + len(cfg.ks))  # a model's load: plain decoding and each K, every prompt
    total = per_model * len(models) + ((n * len(cfg.ks) + (0 if models else n)) if ngram else 0)
    clock = _Clock(progress, cancelled, time.monotonic() + cfg.time_budget_s, total)
    sampling = SamplingParams(temperature=0.0, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed)
    measured: list[Measured] = []
    failed: list[Rejected] = []
    left: list[Candidate] = []
    ngram_open = ngram is not None  # neither measured nor failed yet
    loads: list[Candidate | None] = [*models, None]  # None: the target alone, for the n-gram drafter
    for i, cand in enumerate(loads):
        if cand is None and not ngram_open:
            break
        riders = ([cand] if cand is not None else []) + ([ngram] if ngram_open else [])
        if clock.stop_now():
            left += [c for c in loads[i:] if c is not None]
            break
        name = cand.name if cand is not None else "the target alone"
        clock.tell(f"Loading {name}\u2026")
        engine = None
        try:
            engine = _load(loader, target, cand.path if cand is not None else None, cfg)
            ids = [engine.encode_chat(list(m)) for m in prompts]
            for _ in engine.generate(ids[0], sampling.with_(max_new_tokens=4), SpecParams(enabled=False)):
                pass  # first-call allocations stay out of the timings
            got = _measure_load(engine, riders, ids, cfg, sampling, clock, name)
            measured += got
            ngram_open = ngram_open and all(m.candidate is not ngram for m in got)
        except _Stop:
            pass
        except Exception as e:  # noqa: BLE001 - one candidate that fails is reported, never ends the search
            if cand is None:
                failed.append(Rejected(ngram, f"the target alone failed to run: {_why(e)}"))
                ngram_open = False
            else:
                failed.append(Rejected(cand, f"failed to load or run: {_why(e)}"))
                clock.done += per_model
        finally:
            del engine
            gc.collect()  # one pair in memory at a time
        if clock.why:
            done = {m.candidate for m in measured}
            left += [c for c in riders if c is not ngram and c not in done]
            left += [c for c in loads[i + 1:] if c is not None]
            break
    if ngram_open:
        left.append(ngram)
    why = {"cancelled": "cancelled before it was measured",
           "out of time": f"the time budget ({cfg.time_budget_s:g} s) ran out before it was measured"}
    not_measured = [Rejected(c, why.get(clock.why, "not measured")) for c in left]
    measured.sort(key=lambda m: m.speedup, reverse=True)
    clock.progress("Done" if not clock.why else f"Stopped: {clock.why}", 1.0)
    return measured, failed, not_measured, clock.why


def _why(e: Exception) -> str:
    return str(e).replace("\n", " ") if isinstance(e, (ModelLoadError, ValueError, OSError)) \
        else f"{type(e).__name__}: {e}"


def find_drafts(target: str | None, candidates: Sequence[str] | None = None, prompts: Sequence[Messages] | None = None,
                config: FinderConfig | None = None, progress: Progress | None = None,
                cancelled: Cancelled | None = None, *, ngram: bool = True,
                models: Callable[[], list[LocalModel]] | None = None,
                loader: Callable[..., Any] | None = None) -> FinderResult:
    """Rank the drafts for target (a path, a cached repo id, or None for the embedded target).

    candidates: paths or repo ids to try (default: every model the listing finds); prompts: message lists
    (default: BUILTIN_PROMPTS); ngram: also measure the n-gram drafter. models and loader stand in for the listing
    and load_engine (tests)."""
    t0 = time.monotonic()
    cfg = config or FinderConfig()
    report = progress or (lambda stage, fraction: None)
    stop = cancelled or (lambda: False)
    chats = check_prompts(prompts if prompts is not None else [list(p) for p in BUILTIN_PROMPTS])
    report("Reading the models' headers\u2026", 0.0)
    tgt = describe_target(target)
    bad: list[Rejected] = []
    if candidates is not None:
        listed, bad = candidates_from(candidates)
    else:
        from engine.io.hub import list_local_models

        listed = (models or (lambda: list_local_models(include_unrunnable=True)))()
    ok, rejected = static_checks(tgt, listed)
    report("Checking which candidates are copies of one file\u2026", 0.0)
    ok, copies = distinct_files(ok, stop)
    if loader is None:
        from engine.io.loading import load_engine

        loader = load_engine
    plan = ok + ([NGRAM_CANDIDATE] if ngram else [])
    measured, failed, not_measured, why = measure_all(str(tgt.path), plan, chats, cfg, report, stop, loader)
    return FinderResult(Candidate.of(tgt), cfg, len(chats), measured, bad + rejected + failed, not_measured, copies,
                        cancelled=why == "cancelled", out_of_time=why == "out of time",
                        elapsed_s=time.monotonic() - t0)


def find_drafts_json(target: str | None = None, candidates: Sequence[str] | None = None,
                     prompts: Sequence[Messages] | None = None, max_new_tokens: int = FinderConfig.max_new_tokens,
                     ks: Sequence[int] = FinderConfig.ks, time_budget_s: float = FinderConfig.time_budget_s,
                     progress: Progress | None = None, cancelled: Cancelled | None = None) -> dict[str, Any]:
    """find_drafts with plain arguments and a JSON result: what the window's worker process runs
    (engine/tools/draft_worker.py)."""
    cfg = FinderConfig(max_new_tokens, tuple(ks), time_budget_s)
    return find_drafts(target, candidates, prompts, cfg, progress, cancelled).to_json()


def check_prompts(prompts: Sequence[Messages]) -> list[Messages]:
    """Message lists checked where they enter: at least one, at most MAX_PROMPTS, each a non-empty list of
    {"role": str, "content": str}."""
    from engine.api.messages import check_messages

    chats = [check_messages(list(p)) for p in prompts]
    if not chats:
        raise ValueError("the draft finder needs at least one prompt")
    if len(chats) > MAX_PROMPTS:
        raise ValueError(f"{len(chats)} prompts; the draft finder measures at most {MAX_PROMPTS} (it is a short run)")
    return chats


def prompts_from_rows(rows: list[dict]) -> list[Messages]:
    """A prompts file's rows (speclens-bench's format or Spec-Bench's) as message lists: a Spec-Bench question
    asks its first turn."""
    from engine.tools.specbench import question

    out = []
    for row in rows:
        q = question(row)
        out.append(list(q.messages) if q.messages else [{"role": "user", "content": q.turns[0]}])
    return out


# ---- the command -----------------------------------------------------------------------------------------------

PROG = "speclens-bench --find-drafts"


def table(result: FinderResult) -> str:
    """The ranking, then the candidates turned down and those not measured, each with its reason."""
    t = result.target
    lines = [(f"target: {t.name} ({t.family}, {t.params_b or '?'}B) \u00b7 {result.prompts} prompts, "
              f"{result.config.max_new_tokens} tokens each, greedy, K in {list(result.config.ks)}")]
    head = ("DRAFT", "SPEEDUP", "LEVIATHAN", "BEST K", "ALPHA", "C", "TOK/ROUND", "TOK/S")
    rows = []
    for m in result.measured:
        rows.append((m.candidate.name, f"{m.speedup:.2f}x", "-" if m.predicted is None else f"{m.predicted:.2f}x",
                     str(m.best_k), "-" if m.alpha is None else f"{m.alpha:.2f}",
                     "-" if m.c is None else f"{m.c:.3f}", f"{m.mean_accepted_length:.2f}", f"{m.tokens_per_s:.1f}"))
    if rows:
        widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
        lines += ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                  for r in [head, *rows]]
        lines += [f"note: {m.candidate.name}: {m.note}" for m in result.measured if m.note]
        plain = result.measured[0].plain_tokens_per_s
        lines.append(f"speedup: decode rate over plain decoding's in the same load (plain {plain:.1f} tok/s for the "
                     "best); LEVIATHAN: (1 - a^(K+1)) / ((1 - a)(1 + K c)) at the measured alpha and c")
        if result.near_tie:
            lines.append(near_tie_advice(result.to_json()))
    else:
        lines.append("no candidate was measured")
    lines += [f"not a draft: {r.candidate.name}: {r.reason}" for r in result.rejected]
    lines += [f"not measured: {r.candidate.name}: {r.reason}" for r in result.not_measured]
    lines += [f"same file: {c.candidate.name}: {c.reason}" for c in result.copies]
    return "\n".join(lines)


def near_tie_advice(result: dict[str, Any]) -> str:
    """What to do when the first two are within the finder's noise: the speclens-bench run that tells them apart
    (longer replays, the modes taking turns in one load; one run per draft model). result: FinderResult.to_json()."""
    a, b = result["measured"][:2]
    ks = ",".join(sorted({str(a["best_k"]), str(b["best_k"])}, key=int))
    base = (f"speclens-bench --target {_quoted(result['target']['path'])} --prompts YOUR_PROMPTS.jsonl --k {ks} "
            "--max-new-tokens 128")
    drafts = [m["path"] for m in (a, b) if m["path"] is not None]
    ngram = ",ngram" if len(drafts) < 2 else ""
    cmds = [f"{base} --draft {_quoted(d)} --modes plain,draft{ngram}" for d in drafts] or \
        [f"{base} --modes plain,ngram"]
    lead = (a["speedup"] / b["speedup"] - 1) * 100 if b["speedup"] else 0.0
    return (f"{a['name']} leads {b['name']} by {lead:.0f}%, within the finder's noise (about "
            f"{(NEAR_TIE - 1) * 100:.0f}%); to tell them apart: " + " and ".join(cmds))


def _quoted(path: str) -> str:
    import shlex

    return shlex.quote(path)


def _fail(reason: str) -> None:
    raise SystemExit(f"{PROG}: {reason}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description="Rank the local models (and the n-gram drafter) as drafts "
                                 "for a target: static checks, then a short measured run of each on your prompts.")
    ap.add_argument("--target", help="folder, .gguf or HF-cache repo id (default: the embedded target)")
    ap.add_argument("--candidates", nargs="+", metavar="MODEL",
                    help="the drafts to try (default: every model speclens-models lists)")
    ap.add_argument("--prompts", help="JSONL, one {messages} or Spec-Bench question per line (default: a short "
                    "built-in mix)")
    ap.add_argument("--max-new-tokens", type=int, default=FinderConfig.max_new_tokens)
    ap.add_argument("--k", default=",".join(map(str, FinderConfig.ks)), help="the K values tried, e.g. 1,2,4")
    ap.add_argument("--time-budget", type=float, default=FinderConfig.time_budget_s,
                    help="seconds for the whole measuring, loads included")
    ap.add_argument("--no-ngram", action="store_true", help="leave the n-gram drafter out")
    ap.add_argument("--device", default=None)
    ap.add_argument("--json", nargs="?", const="-", metavar="FILE",
                    help="the result as JSON: on stdout instead of the table, or written to FILE")
    a = ap.parse_args(argv)
    try:
        ks = tuple(int(x) for x in a.k.split(",") if x.strip())
    except ValueError:
        _fail(f"--k must be a list of integers like 1,2,4 (got {a.k!r})")
    try:
        cfg = FinderConfig(a.max_new_tokens, ks, a.time_budget, device=a.device)
    except ValueError as e:
        _fail(str(e))
    prompts = None
    if a.prompts:
        try:
            prompts = check_prompts(prompts_from_rows(read_prompts(a.prompts)))
        except ValueError as e:
            _fail(f"{a.prompts}: {e}")

    def progress(stage: str, fraction: float) -> None:
        print(f"\r[{fraction:4.0%}] {stage[:70]:<70}", end="", file=sys.stderr, flush=True)

    try:
        result = find_drafts(a.target, a.candidates, prompts, cfg, progress, ngram=not a.no_ngram)
    except (ModelLoadError, ValueError, OSError) as e:
        print(file=sys.stderr)
        _fail(str(e).replace("\n", " "))
    except KeyboardInterrupt:
        print(file=sys.stderr)
        _fail("interrupted")
    print(file=sys.stderr)
    data = result.to_json()
    if a.json == "-":
        print(json.dumps(data, indent=1))
    else:
        print(table(result))
        if a.json:
            Path(a.json).write_text(json.dumps(data, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
