"""speclens-bench: plain vs speculative decoding on a prompt set, as a table and as JSON."""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import NoReturn

from engine.api.config import (
    APP_DEFAULTS,
    NEEDS_DRAFT_MODEL,
    STOP_BELOW,
    SamplingParams,
    SpecParams,
)
from engine.api.events import RoundEvent, Summary
from engine.io.loading import load_engine
from engine.runtime.engine import Engine
from engine.tools import results as records  # main's `results` are its modes'
from engine.tools import specbench
from engine.tools.bench_report import Result, mode_label, report
from engine.tools.in_step import Request, run_in_step
from engine.tools.prompt_file import read_prompts
from engine.tools.specbench import Question, Tally

DRAFTER_OF = {"draft": "model", "ngram": "ngram", "hybrid": "hybrid"}  # mode -> SpecParams.drafter
MODES = ("plain", *DRAFTER_OF, "default")  # default: the app's settings as it starts (APP_DEFAULTS)
PROG = "speclens-bench"
MAX_REPEATS = 100  # passes over the prompts, --repeats and --min-tokens' top-up together


def fail(reason: str) -> NoReturn:
    """Every usage error ends the same way: one line on stderr (Python prints a SystemExit's text), status 1."""
    raise SystemExit(f"{PROG}: {reason}")


def check_writable(path: str | Path) -> None:
    """Fail now, not after the whole benchmark, when the results file cannot be written. Opening for append
    leaves an existing file as it is; a file created only for the check is removed again."""
    p = Path(path)
    if p.is_dir():
        fail(f"--json {p} is a directory")
    existed = p.exists()
    try:
        with open(p, "a", encoding="utf-8"):
            pass
    except OSError as e:
        fail(f"cannot write --json file {p}: {e.strerror or e}")
    if not existed:
        p.unlink(missing_ok=True)


def check_device(device: str | None) -> None:
    if device is None:
        return
    import torch

    try:
        dev = torch.device(device)
    except RuntimeError as e:
        fail(f"--device {device!r} is not a device ({str(e).splitlines()[0]})")
    if dev.type == "cuda" and not torch.cuda.is_available():
        fail(f"--device {device!r}: CUDA is not available on this machine")


def mode_spec(mode: str, k: int, stop_below: float = 0.0, adaptive: bool = False) -> SpecParams:
    """What a mode runs. "default" is the app's speculation as it starts, whatever --k, --stop-below and
    --adaptive say: it measures what a user gets without touching a control."""
    if mode == "default":
        return APP_DEFAULTS.spec_params()
    drafter = DRAFTER_OF.get(mode)
    return (SpecParams(enabled=False) if drafter is None
            else SpecParams(k=k, drafter=drafter, stop_below=stop_below, adaptive=adaptive))


class ModeRun:
    """One mode's replies, gathered prompt by prompt, and their Result. `engine`: the mode's own (Engine.twin)
    when the modes take turns round by round (run_interleaved)."""

    def __init__(self, mode: str, k: int, sampling: SamplingParams, stop_below: float = 0.0,
                 adaptive: bool = False, engine: Engine | None = None) -> None:
        self.mode, self.sampling, self.engine = mode, sampling, engine
        self.spec = mode_spec(mode, k, stop_below, adaptive)
        self.outputs: list[list[int]] = []
        self.summaries: list[Summary] = []
        self.replies: list[list[RoundEvent]] = []  # each reply's rounds
        self.categories: dict[str, Tally] = {}
        self.seconds = 0.0

    @property
    def label(self) -> str:
        return mode_label(self.mode, self.spec.k)

    def add(self, engine: Engine, prompt: list[int] | Question) -> None:
        """prompt: token ids, one request, or a Question (see Ask), asked on `engine` alone."""
        run_in_step([Ask(self, engine, prompt)])

    def record(self, rounds: list[RoundEvent], summary: Summary, question: Question | None) -> None:
        self.seconds += summary.total_s
        self.outputs.append(list(summary.token_ids))
        self.summaries.append(summary)
        self.replies.append(rounds)
        if question is not None:
            self.categories.setdefault(question.category, Tally()).add(rounds, summary)

    def result(self) -> Result:
        spec, summaries = self.spec, self.summaries
        rounds = [e for reply in self.replies for e in reply]
        new = sum(s.new_tokens for s in summaries)
        decode_s = sum(specbench.decode_seconds(e, s) for e, s in zip(self.replies, summaries))
        drafted, accepted = sum(s.drafted for s in summaries), sum(s.accepted for s in summaries)
        spec_rounds = [e for e in rounds if e.drafted]
        rejections = sum(e.accepted < len(e.drafted) for e in spec_rounds)
        widths: dict[int, list[float]] = {}
        for e in rounds:
            widths.setdefault(len(e.drafted) + 1, []).append(e.verify_ms)
        return Result(
            self.mode, spec.k if spec.enabled else 0, self.sampling.temperature,
            new / decode_s if decode_s > 0 else 0.0, new, accepted / drafted if drafted else 0.0,
            new / len(rounds) if rounds else 0.0, self.seconds, len(rounds),
            e2e_tokens_per_s=new / self.seconds if self.seconds > 0 else 0.0, stop_below=spec.stop_below,
            adaptive=spec.adaptive, drafted_tokens=drafted, accepted_tokens=accepted,
            alpha=accepted / (accepted + rejections) if spec_rounds else None,
            draft_ms_per_token=sum(e.draft_ms for e in spec_rounds) / drafted if drafted else None,
            verify_ms_by_width={w: sum(v) / len(v) for w, v in sorted(widths.items())}, outputs=list(self.outputs),
            categories=self.categories, per_position_acceptance=_per_position(rounds),
        )


class Ask:
    """One prompt as a lane of run_in_step: token ids, one request, or a Question, whose turns are each asked after
    the model's own answer to the one before, reusing the conversation's cache as the app does."""

    def __init__(self, run: ModeRun, engine: Engine, prompt: list[int] | Question) -> None:
        engine.reset()  # no cross-prompt prefix reuse: every prompt pays its own prefill
        self.run, self.engine = run, engine
        self.question = prompt if isinstance(prompt, Question) else None
        self.ids = None if self.question is not None else prompt
        self.messages = list(self.question.messages) if self.question is not None else []
        self.turns = list(self.question.turns or (None,)) if self.question is not None else [None]

    def request(self) -> Request | None:
        if not self.turns:
            return None
        turn = self.turns.pop(0)
        if turn is not None:
            self.messages.append({"role": "user", "content": turn})
        ids = self.engine.encode_chat(self.messages) if self.question is not None else self.ids
        return self.engine.generate(ids, self.run.sampling, self.run.spec)

    def finished(self, rounds: list[RoundEvent], summary: Summary) -> None:
        self.run.record(rounds, summary, self.question)
        if self.question is not None:
            self.messages.append({"role": "assistant", "content": summary.text})


def run_mode(engine: Engine, prompts: list[list[int]] | list[Question], mode: str, k: int, sampling: SamplingParams,
             stop_below: float = 0.0, adaptive: bool = False, into: ModeRun | None = None) -> Result:
    """One mode over `prompts` (token ids, or Questions: see ModeRun.add); `into` gathers them with that run's
    earlier prompts, and the Result is of all of them."""
    run = into or ModeRun(mode, k, sampling, stop_below, adaptive)
    for prompt in prompts:
        run.add(engine, prompt)
    return run.result()


def run_interleaved(questions: list[Question], runs: list[ModeRun], start: int = 0) -> list[Result]:
    """Every run over every question, each run on its own engine, the runs taking turns round by round
    (engine.tools.in_step: a host whose speed drifts over minutes slows every mode alike); each question starts one
    run further along, which breaks the ties. start: prompts already asked (a top-up goes on turning where the first
    pass stopped)."""
    for i, question in enumerate(questions, start):
        order = runs[i % len(runs):] + runs[: i % len(runs)]
        run_in_step([Ask(run, run.engine, question) for run in order])
        print(f"  prompt {i + 1}/{start + len(questions)}: "
              + ", ".join(f"{run.label} {run.result().tokens_per_s:.2f}" for run in runs) + " tok/s so far",
              file=sys.stderr)
    return [run.result() for run in runs]


def _per_position(rounds: list[RoundEvent]) -> list[float]:
    tally = Tally()
    for e in rounds:
        tally.add_round(e)
    return [round(x, 4) for x in tally.per_position]


def parse_ks(text: str) -> list[int]:
    try:
        ks = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        fail(f"--k must be an integer or a list like 1,2,4,8 (got {text!r})")
    if not ks or min(ks) < 1:
        fail(f"every K must be >= 1 (got {text!r})")
    for k in ks:  # the engine's own limits, checked before anything loads
        try:
            SpecParams(k=k)
        except ValueError as e:
            fail(f"--k {text}: {e}")
    return ks


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        fail(message)  # one line, like every other usage error (argparse prints the usage first)


def warm_up(engine: Engine, first: Question, sampling: SamplingParams) -> None:
    """A few plain tokens of the first question, so first-call allocations stay out of the timings."""
    warm = list(first.messages) or [{"role": "user", "content": first.turns[0]}]
    for _ in engine.generate(engine.encode_chat(warm), sampling.with_(max_new_tokens=4), SpecParams(enabled=False)):
        pass
    engine.reset()


def load(target: str | None, draft: str | None, device: str | None) -> Engine:
    """The given pair, or the embedded one; a model that cannot be found or read ends in one line too."""
    from engine.io.provision import ProvisionError
    from engine.io.weights import ModelLoadError

    try:
        if target is None:
            from engine.io.provision import default_pair

            t_dir, d_dir = default_pair(progress=lambda s, f: print(f"\r{s}", end="", file=sys.stderr, flush=True))
            target, draft = str(t_dir), str(d_dir)
            print(file=sys.stderr)
        engine = load_engine(target, draft, device=device)
        engine.settle()  # time the steady state: the weights on huge pages where the kernel allows
        return engine
    except (ModelLoadError, ProvisionError) as e:
        fail(str(e).replace("\n", " "))


def ran_kernels(engine: Engine) -> str:
    """Which kernels run the quantized matrices ("AVX2 kernels (prebuilt)", or the fallback with why), whether a
    GPU replays its short passes as CUDA graphs, or "none" when the models are dense on the CPU: a rate means little
    without it (the CPU's fallback is ~11x slower, a GPU's eager steps ~4x)."""
    if getattr(engine, "device", None) is not None and engine.device.type == "cuda":
        graphs = getattr(engine.target, "graphs", None) is not None
        return "cuBLAS, short passes as CUDA graphs" if graphs else "cuBLAS, eager (no CUDA graphs)"
    if not getattr(engine, "weights_format", None):
        return "none (dense weights)"
    from engine.cpu import ext

    return ext.describe()


def _parser() -> _Parser:
    ap = _Parser(prog=PROG, description=__doc__)
    ap.add_argument("--target", help="folder, .gguf or HF-cache repo id (default: the embedded pair)")
    ap.add_argument("--draft", help="folder, .gguf or HF-cache repo id (default: the embedded pair)")
    ap.add_argument("--prompts", required=True, help="JSONL, one {id, messages} per line")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--k", default="4", help="K, or a list to sweep: 1,2,4,8")
    ap.add_argument("--temperature", type=float, default=APP_DEFAULTS.temperature)
    ap.add_argument("--top-p", type=float, default=APP_DEFAULTS.top_p)
    ap.add_argument("--stop-below", type=float, default=0.0, help="the draft model stops drafting once its confidence "
                    f"that the whole draft passes falls below this (the app's default: {STOP_BELOW}; 0: always K)")
    ap.add_argument("--adaptive", action="store_true", help="adaptive K: K is a ceiling, chosen each round")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=1, help="ask every prompt this many times (the modes' turns moving "
                    "on each time), for rates steadier than one reply's")
    ap.add_argument("--min-tokens", type=int, default=0, help="ask a kind's prompts again (after --repeats) until its "
                    "replies hold this many new tokens a mode, so that kinds of short replies are measured as long "
                    f"as the others (at most {MAX_REPEATS} passes in all)")
    ap.add_argument("--per-category", type=int, metavar="N", help="ask N questions of each category, evenly "
                    "spaced through the file (Spec-Bench's own file holds 80 a category)")
    ap.add_argument("--modes", default="plain,draft,ngram")
    ap.add_argument("--device", default=None)
    ap.add_argument("--json", dest="json_out", help="write the results here")
    ap.add_argument("--server", metavar="URL", help="benchmark this running llama-server / vLLM instead (mode draft; "
                    "the API key from $SPECLENS_API_KEY)")
    ap.add_argument("--plain-server", metavar="URL", help="with --server: the same model served without a draft "
                    "(mode plain)")
    ap.add_argument("--find-drafts", action="store_true", help="rank the local models and the n-gram drafter as "
                    "drafts for --target instead, each measured (speclens-bench --find-drafts --help)")
    records.add_arguments(ap)
    return ap


def _checked(a: argparse.Namespace) -> tuple[list[str], list[int], SamplingParams, list]:
    """(modes, ks, sampling, prompts) from the parsed arguments, each checked before anything loads: a mistake
    costs no model load and no benchmark run."""
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        fail(f"unknown mode(s) {unknown}; choose from {', '.join(MODES)}")
    if not modes:
        fail("--modes names no mode")
    ks = parse_ks(a.k)
    if not 1 <= a.repeats <= MAX_REPEATS:
        fail(f"--repeats must be in 1..{MAX_REPEATS}, got {a.repeats}")
    if not 0 <= a.min_tokens <= 1_000_000:
        fail(f"--min-tokens must be in 0..1000000, got {a.min_tokens}")
    if a.per_category is not None and a.per_category < 1:
        fail(f"--per-category must be at least 1, got {a.per_category}")
    try:
        sampling = SamplingParams(temperature=a.temperature, top_p=a.top_p, max_new_tokens=a.max_new_tokens,
                                  seed=a.seed)
    except ValueError as e:
        fail(f"bad sampling settings: {e}")
    try:
        SpecParams(stop_below=a.stop_below, adaptive=a.adaptive)
    except ValueError as e:
        fail(f"--stop-below {a.stop_below}: {e}")
    prompts = read_prompts(a.prompts)
    if a.json_out:
        check_writable(a.json_out)
    check_device(a.device)
    if a.target is None and a.draft is not None:
        fail("--draft given without --target")
    for mode in modes:
        spec = mode_spec(mode, ks[0])
        if spec.enabled and spec.drafter in NEEDS_DRAFT_MODEL and a.target is not None and a.draft is None:
            fail(f"mode '{mode}' needs --draft")
    return modes, ks, sampling, prompts


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = sys.argv[1:] if argv is None else argv
    if "--find-drafts" in args:  # its own options: engine.tools.draft_finder
        from engine.tools.draft_finder import main as find_drafts

        return find_drafts([x for x in args if x != "--find-drafts"])
    a = ap.parse_args(argv)
    if a.server or a.plain_server:
        from engine.tools.bench_server import main_server

        return main_server(a, read_prompts, check_writable, fail)

    modes, ks, sampling, prompts = _checked(a)
    engine = load(a.target, a.draft, a.device)
    print(f"loaded in {engine.load_seconds:.1f} s on {engine.device} ({engine.dtype_name})", file=sys.stderr)
    kernels = ran_kernels(engine)
    print(f"kernels: {kernels}", file=sys.stderr)
    questions = [specbench.question(p) for p in prompts]
    if a.per_category:
        questions = specbench.per_category(questions, a.per_category)
        print(f"--per-category {a.per_category}: {len(questions)} questions: "
              f"{', '.join(q.id for q in questions)}", file=sys.stderr)
    by_category = any(q.turns for q in questions) or len({q.category for q in questions}) > 1
    warm_up(engine, questions[0], sampling)

    # plain and default read no --k; each mode gets an engine of its own, on the loaded one's weights
    settings = [(mode, k) for mode in modes for k in ([ks[0]] if mode in ("plain", "default") else ks)]
    engines = [engine] + [engine.twin() for _ in settings[1:]]
    for e in engines[1:]:
        warm_up(e, questions[0], sampling)
    runs = [ModeRun(mode, k, sampling, a.stop_below, a.adaptive, e) for (mode, k), e in zip(settings, engines)]
    results = run_interleaved(questions * a.repeats, runs)
    extra = (specbench.top_up(questions, a.repeats, runs[0].categories, a.min_tokens, MAX_REPEATS)
             if a.min_tokens else [])
    if extra:
        print(f"--min-tokens {a.min_tokens}: {len(extra)} more replies a mode for the short kinds", file=sys.stderr)
        results = run_interleaved(extra, runs, start=len(questions) * a.repeats)
    out = {"device": str(engine.device), "kernels": kernels, "target": engine.target_name,
           "draft": engine.draft_name, **report(results, sampling.greedy, by_category)}
    if a.json_out:
        Path(a.json_out).write_text(json.dumps(out, indent=1), encoding="utf-8")
    # the record keeps the figures, not every mode's generated tokens (those stay in --json)
    figures = {**out, "results": [{k: v for k, v in r.items() if k != "outputs"} for r in out["results"]]}
    records.record(a, PROG, figures, argv=args, device=str(engine.device))
    return 0


if __name__ == "__main__":
    sys.exit(main())
