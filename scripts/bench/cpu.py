"""Side-by-side CPU benchmark on the embedded pair, in one run: our plain decode, our draft model at K = 1..6,
our n-gram drafter, the two together (hybrid), transformers' `generate` (which needs `pip install accelerate` to
read a GGUF), and llama.cpp on the same GGUF files (../shared/bench/llama_cpp_peer.sh, which builds llama.cpp once per machine).

    python -m scripts.bench.cpu --max-new-tokens 128

(one record of the run in docs/results/, engine/tools/results.py; --json FILE writes the figures there too)

Greedy throughout, so every one of our modes must produce the same tokens as our plain decode (checked and
printed). Our rates are decode rates (the target's and the draft's prompt prefills excluded), like llama.cpp's
figures; the end-to-end rates are printed beside them. Prints tokens/s, the ratios against the peers, the cost
of a target pass over 1..9 tokens in decode steps, alpha, c, the Leviathan bound, the time to a ready pair and
the peak RSS with the pair loaded.

The modes take turns on each prompt (the order reversed on every other prompt), and llama.cpp's plain decode of the
target is read (llama-bench, one repetition) before the first prompt and after each: on a shared host whose speed
drifts by ±25% from minute to minute, every mode and the mean of those readings then span the same minutes, and
their ratios hold where a mode measured in one minute and llama.cpp's full run ten minutes later need not.
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import date
from pathlib import Path

import torch

from engine.analysis.theory import theoretical_speedup
from engine.api.config import APP_DEFAULTS, STOP_BELOW, SamplingParams, SpecParams
from engine.api.events import RoundEvent, Summary
from engine.io.loading import load_engine
from engine.io.provision import default_pair
from engine.cpu import ext
from engine.cpu.machine import this_cpu
from engine.runtime.engine import Engine
from engine.tools import results
from engine.tools.bench import read_prompts
from scripts.bench.pair_passes import PairPasses

SHARED = Path(__file__).resolve().parents[3] / "shared" / "bench"
DEFAULT_MODE = "hybrid K=4 stop"  # the label of the app's default settings (APP_DEFAULTS) in the records


def cpu_line() -> str:
    return this_cpu().line()


def rss_mb() -> tuple[float, float]:
    """(current, peak) resident set of this process in MB."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    try:
        cur = int(Path("/proc/self/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except OSError:
        cur = float("nan")
    return cur, peak


class ModeRun:
    """One of our modes over the prompts, a prompt at a time (the modes take turns on each prompt).
    tokens_per_s: the decode rate, prompt processing excluded as llama.cpp's figures exclude it: the target's
    prefill (llama-bench tg) and the draft model's (llama-speculative-simple evaluates the prompt on the target
    and the draft before its decode timer starts; ours is lazy, in the first round, and reported on its own);
    e2e_tokens_per_s: wall clock from request to last token, everything included."""

    def __init__(self, spec: SpecParams) -> None:
        self.spec = spec
        self.tokens, self.seconds, self.decode_s = 0, 0.0, 0.0
        self.outputs: list[list[int]] = []
        self.rounds: list[RoundEvent] = []

    def add(self, engine: Engine, prompt: list[int], max_new: int) -> None:
        engine.reset()
        t = time.perf_counter()
        events = list(engine.generate(prompt, SamplingParams(max_new_tokens=max_new), self.spec))
        self.seconds += time.perf_counter() - t
        s = events[-1]
        assert isinstance(s, Summary)
        self.decode_s += s.total_s - s.prefill_s - s.draft_prefill_ms / 1e3
        self.tokens += s.new_tokens
        self.outputs.append(list(s.token_ids))
        self.rounds += [e for e in events if isinstance(e, RoundEvent)]

    def result(self) -> dict:
        return {"tokens_per_s": self.tokens / self.decode_s, "e2e_tokens_per_s": self.tokens / self.seconds,
                "tokens": self.tokens, "outputs": self.outputs, "rounds": self.rounds}


def pass_times(engine: Engine, prompt: list[int], widths=(1, 2, 3, 5, 9), repeats: int = 12,
               after_round: Callable[[], None] | None = None) -> dict[int, list[float]]:
    """ms of one target forward over `width` new tokens after the prompt (a verify pass of K = width - 1), per round.
    The widths take turns, round by round: a host whose speed drifts (±25% between minutes on a shared VM) then
    moves all of them alike, and their ratios hold. `after_round` runs after each round (a bandwidth read)."""
    passes = PairPasses(engine, prompt, draft=False)
    times: dict[int, list[float]] = {w: [] for w in widths}
    for _ in range(repeats):
        for w in widths:
            times[w].append(passes.once("target", w))
        if after_round is not None:
            after_round()
    engine.reset()
    return times


def pass_costs(engine: Engine, prompt: list[int], widths=(1, 2, 3, 5, 9), repeats: int = 12) -> dict[int, float]:
    """The median of pass_times for each width."""
    return {w: statistics.median(ts) for w, ts in pass_times(engine, prompt, widths, repeats).items()}


def alpha_hat(rounds: list[RoundEvent]) -> float:
    """Per-token acceptance probability: accepted / (accepted + rejections)."""
    acc = sum(r.accepted for r in rounds)
    rej = sum(1 for r in rounds if r.accepted < len(r.drafted))
    return acc / (acc + rej) if acc + rej else 0.0


def hf_generate(target: Path, prompts: list[list[int]], max_new: int) -> dict:
    """transformers' own generate on the same GGUF (dequantized by transformers to fp32)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(target.parent), gguf_file=target.name, dtype=torch.float32).eval()
    eos = model.generation_config.eos_token_id
    tokens, seconds, outputs = 0, 0.0, []
    with torch.inference_mode():
        model.generate(torch.tensor([prompts[0]]), max_new_tokens=4, do_sample=False)  # warm-up
        for p in prompts:
            ids = torch.tensor([p])
            t = time.perf_counter()
            res = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new, do_sample=False,
                                 eos_token_id=eos)
            seconds += time.perf_counter() - t
            outputs.append(res[0, len(p):].tolist())
            tokens += len(outputs[-1])
    del model
    gc.collect()
    return {"tokens_per_s": tokens / seconds, "tokens": tokens, "outputs": outputs}


class PeerPlain:
    """llama.cpp's plain decode of the target (`llama-bench` tg, one repetition), read before our first prompt and
    after each prompt's turn of all our modes: on a host whose speed drifts from minute to minute, the mean of these
    readings spans the same minutes as every one of our modes."""

    def __init__(self, target: Path, max_new: int) -> None:
        self.target, self.max_new = target, max_new
        self.bin: Path | None = None
        build = SHARED / "llama_cpp_build.sh"  # prints its tools' folder; builds them first on a new machine
        if build.is_file():
            run = subprocess.run(["bash", str(build)], env=os.environ | {"PYTHON": sys.executable}, text=True,
                                 capture_output=True)
            if run.returncode == 0 and (Path(run.stdout.strip()) / "llama-bench").is_file():
                self.bin = Path(run.stdout.strip())
            else:
                print(f"llama.cpp build failed ({run.returncode}): {run.stderr.strip()[-300:]}", file=sys.stderr)

    def read(self) -> float | None:
        if self.bin is None:
            return None
        run = subprocess.run([str(self.bin / "llama-bench"), "-m", str(self.target), "-t", str(torch.get_num_threads()),
                              "-p", "0", "-n", str(self.max_new), "-r", "1", "-o", "json"],
                             text=True, capture_output=True)
        if run.returncode != 0:
            print(f"llama-bench failed ({run.returncode}): {run.stderr.strip()[-300:]}", file=sys.stderr)
            return None
        return float(json.loads(run.stdout)[0]["avg_ts"])


def llama_cpp(target: Path, draft: Path, prompts: Path, max_new: int) -> dict | None:
    script = SHARED / "llama_cpp_peer.sh"
    if not script.is_file():
        print("llama.cpp peer: ../shared/bench/llama_cpp_peer.sh not found; skipped", file=sys.stderr)
        return None
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "peer.json"
        env = os.environ | {"PYTHON": sys.executable, "THREADS": str(torch.get_num_threads())}
        run = subprocess.run(["bash", str(script), str(target), str(draft), str(prompts), str(max_new), str(out)],
                             env=env, text=True, capture_output=True)
        print(run.stdout, end="", file=sys.stderr)
        if run.returncode != 0 or not out.is_file():
            print(f"llama.cpp peer failed ({run.returncode}): {run.stderr.strip()[-500:]}", file=sys.stderr)
            return None
        return json.loads(out.read_text())


def fmt(v: float | None, spec: str, unit: str = "") -> str:
    """A table cell: v formatted, or a dash of the same width."""
    return format(v, spec) + unit if v is not None else "-".rjust(len(format(0.0, spec)) + len(unit))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", default=str(SHARED / "prompts.jsonl"))
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--ks", default="1,2,3,4,5,6", help="K values for the draft model")
    ap.add_argument("--limit", type=int, default=0, help="use only the first N prompts")
    ap.add_argument("--no-hf", action="store_true", help="skip transformers' generate (slow to load)")
    ap.add_argument("--no-peer", action="store_true", help="skip llama.cpp")
    ap.add_argument("--json", help="write all figures here")
    results.add_arguments(ap)
    a = ap.parse_args()
    ks = [int(k) for k in a.ks.split(",")]

    target, draft = default_pair()
    rows = read_prompts(a.prompts)[: a.limit or None]
    t0 = time.perf_counter()
    engine = load_engine(str(target), str(draft), device="cpu")
    ready_s = time.perf_counter() - t0
    huge = engine.settle()
    mod = ext.load()
    kernels = mod.isa() if mod is not None else "none (PyTorch fallback)"
    if kernels == "avx512vnni":  # the machine's tile choice (engine/cpu/tune.py): only these kernels have one
        kernels += f", group pairs from {mod.pair_from()} rows (0: default, 17: never)"
    if mod is not None and mod.isa() != "scalar":  # the other choice (tune.py), every x86 build's
        kernels += f", weights asked ahead over 1-6 rows: {'yes' if mod.stream_prefetch() else 'no'}"
    prompts = [engine.encode_chat(r["messages"]) for r in rows]
    print(f"{cpu_line()}\n{len(prompts)} prompts, {a.max_new_tokens} new tokens, torch threads "
          f"{torch.get_num_threads()}; pair ready in {ready_s:.2f} s; {huge / 1e6:.0f} MB of weights then on huge "
          f"pages; kernels {kernels}", file=sys.stderr)

    # "stop": K is a ceiling, the draft stops early when unsure (SpecParams.stop_below, the app's default)
    modes = [("plain", SpecParams(enabled=False))] + [(f"draft K={k}", SpecParams(k=k)) for k in ks] + \
        [(f"draft K={k} stop", SpecParams(k=k, stop_below=STOP_BELOW)) for k in (2, 4, 6)] + \
        [("ngram K=4", SpecParams(k=4, drafter="ngram")),
         (DEFAULT_MODE, APP_DEFAULTS.spec_params())]
    runs = {name: ModeRun(spec) for name, spec in modes}
    for name, spec in modes:
        ModeRun(spec).add(engine, prompts[0], 4)  # warm-up
    peer_plain = None if a.no_peer else PeerPlain(target, a.max_new_tokens)
    series = [peer_plain.read() if peer_plain else None]  # llama.cpp's plain rate before the first prompt
    for i, p in enumerate(prompts):
        # every mode on this prompt, in turn; the order reversed on every other prompt, so that a steady drift of
        # the host's speed moves all modes alike
        for name in (list(runs) if i % 2 == 0 else list(runs)[::-1]):
            runs[name].add(engine, p, a.max_new_tokens)
        series.append(peer_plain.read() if peer_plain else None)
        print(f"  prompt {i + 1}/{len(prompts)}: all modes done"
              + (f"; llama.cpp plain {series[-1]:.2f} tok/s" if series[-1] else ""), file=sys.stderr, flush=True)
    ours = {name: r.result() for name, r in runs.items()}
    readings = [v for v in series if v is not None]
    peer_same = statistics.mean(readings) if readings else None  # llama.cpp's plain over the same minutes
    rss_now, rss_peak = rss_mb()
    costs = pass_costs(engine, prompts[0])
    plain_rounds = ours["plain"]["rounds"]
    plain_ms = sum(r.verify_ms for r in plain_rounds) / len(plain_rounds)
    del engine
    gc.collect()

    peer = None if a.no_peer else llama_cpp(target, draft, Path(a.prompts), a.max_new_tokens)
    hf = None
    if not a.no_hf:
        try:
            hf = hf_generate(target, prompts, a.max_new_tokens)
        except (ImportError, ValueError) as e:  # transformers needs `accelerate` to read a GGUF
            print(f"transformers generate skipped: {e}", file=sys.stderr)

    base = ours["plain"]
    if peer_same:
        print(f"\nllama.cpp's plain decode read {len(readings)} times between our prompts: mean {peer_same:.2f} tok/s "
              f"(range {min(readings):.2f}-{max(readings):.2f})")
    print(f"\n{'mode':<22}{'tok/s':>8}{'e2e':>7}{'vs our plain':>14}{'same tokens':>13}{'alpha':>7}{'c':>6}{'bound':>7}"
          f"{'vs llama.cpp plain':>20}")
    summary = {}
    for name, r in ours.items():
        same = sum(o == b for o, b in zip(r["outputs"], base["outputs"]))
        spec_rounds = [e for e in r["rounds"] if e.drafted]
        alpha = alpha_hat(r["rounds"]) if spec_rounds else None
        c = bound = None
        spec = dict(modes)[name]
        if spec_rounds and spec.drafter == "model":
            c = sum(e.draft_ms for e in spec_rounds) / sum(len(e.drafted) for e in spec_rounds) / plain_ms
            bound = theoretical_speedup(alpha, spec.k, c) if not spec.stop_below else None  # the bound is for a fixed K
        summary[name] = {"tokens_per_s": r["tokens_per_s"], "e2e_tokens_per_s": r["e2e_tokens_per_s"],
                         "tokens": r["tokens"], "same_as_plain": same,
                         "alpha": alpha, "c": c, "leviathan_bound": bound,
                         "over_llama_cpp_plain_same_minutes": r["tokens_per_s"] / peer_same if peer_same else None}
        print(f"ours {name:<17}{r['tokens_per_s']:>8.2f}{r['e2e_tokens_per_s']:>7.2f}"
              f"{r['tokens_per_s'] / base['tokens_per_s']:>13.2f}x"
              f"{same:>9}/{len(base['outputs'])}{fmt(alpha, '>7.3f')}{fmt(c, '>6.2f')}{fmt(bound, '>6.2f', 'x')}"
              f"{fmt(peer_same and r['tokens_per_s'] / peer_same, '>19.2f', 'x')}")
    if hf:
        same = sum(o == b for o, b in zip(hf["outputs"], base["outputs"]))
        print(f"{'transformers generate':<22}{'':>8}{hf['tokens_per_s']:>7.2f}"  # end to end, like our e2e column
              f"{hf['tokens_per_s'] / base['e2e_tokens_per_s']:>13.2f}x{same:>9}/{len(base['outputs'])}")
    print("\ntarget pass over N tokens: " + ", ".join(f"{w}: {ms:.0f} ms = {ms / costs[1]:.2f} steps"
                                                      for w, ms in costs.items()))
    best_name = max((n for n in ours if n != "plain"), key=lambda n: ours[n]["tokens_per_s"])
    best = ours[best_name]["tokens_per_s"]
    ratios = {f"best speculative ({best_name}) / our plain": best / base["tokens_per_s"]}
    if hf:
        ratios["our plain / transformers generate (end to end)"] = base["e2e_tokens_per_s"] / hf["tokens_per_s"]
    if peer_same:  # against llama.cpp's plain read between our prompts: the same minutes
        ratios |= {"our plain / llama.cpp plain (same minutes)": base["tokens_per_s"] / peer_same,
                   f"our best speculative ({best_name}) / llama.cpp plain (same minutes)": best / peer_same,
                   f"the app's default ({DEFAULT_MODE}) / llama.cpp plain (same minutes)":
                       ours[DEFAULT_MODE]["tokens_per_s"] / peer_same}
    if peer:  # llama.cpp's full run, after all of ours
        lp = peer["target_plain_tokens_per_s"]
        lspec = max(s["tokens_per_s"] for s in peer["speculative"])
        ratios |= {"our plain / llama.cpp plain": base["tokens_per_s"] / lp,
                   "our best speculative / llama.cpp plain": best / lp,
                   "our best speculative / llama.cpp best speculative": best / lspec}
    print(f"\npair ready in {ready_s:.2f} s; engine RSS with the pair loaded {rss_now:.0f} MB (peak {rss_peak:.0f} MB)")
    for name, v in ratios.items():
        print(f"{name}: {v:.2f}x")
    print(f"machine: {cpu_line()}; torch {torch.__version__}; {date.today()}")
    figures = {
        "max_new_tokens": a.max_new_tokens, "prompts": len(prompts), "ready_s": ready_s, "huge_pages_mb": huge / 1e6,
        "kernels": kernels, "rss_mb": rss_now, "peak_rss_mb": rss_peak,
        "ours": summary, "pass_ms": costs, "plain_step_ms": plain_ms, "llama_cpp_plain_between_prompts": series,
        "transformers_generate": hf and {"tokens_per_s": hf["tokens_per_s"], "tokens": hf["tokens"]},
        "llama_cpp": peer, "ratios": ratios,
    }
    if a.json:
        Path(a.json).write_text(json.dumps({"machine": cpu_line(), "date": str(date.today()), **figures}, indent=1))
    results.record(a, "scripts.bench.cpu", figures)  # the record carries the machine and the date itself
    return 0


if __name__ == "__main__":
    sys.exit(main())
