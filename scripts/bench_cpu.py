"""Side-by-side CPU benchmark on the embedded pair: our plain and speculative decoding against
Hugging Face transformers' generate, assisted generation and prompt lookup, all in one run.

    python scripts/bench_cpu.py --prompts ../shared/bench/prompts.jsonl --max-new-tokens 128 --k 4

Greedy throughout, so every mode must produce the same tokens as plain decoding (checked and printed).
Prints tokens/s per mode, the ratios the README quotes, and alpha, c and the Leviathan bound.
"""
from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from datetime import date
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.adaptive import expected_speedup  # noqa: E402
from engine.bench import read_prompts  # noqa: E402
from engine.config import SamplingParams, SpecParams  # noqa: E402
from engine.engine import Engine  # noqa: E402
from engine.events import RoundEvent, Summary  # noqa: E402
from engine.provision import default_pair  # noqa: E402


def hf_modes(target_dir: str, draft_dir: str, prompts: list[list[int]], max_new: int, k: int,
             which: list[str]) -> dict[str, dict]:
    from transformers import AutoModelForCausalLM

    target = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32).eval()
    draft = AutoModelForCausalLM.from_pretrained(draft_dir, dtype=torch.float32).eval()
    eos = target.generation_config.eos_token_id
    modes = {
        "hf generate": {},
        "hf assisted": {"assistant_model": draft},
        "hf prompt lookup": {"prompt_lookup_num_tokens": k},
    }
    out = {}
    for name, extra in ((n, e) for n, e in modes.items() if n.removeprefix("hf ").replace(" ", "-") in which):
        ids = torch.tensor([prompts[0]])
        target.generate(ids, max_new_tokens=4, do_sample=False, **extra)  # warm-up
        tokens, seconds, outputs = 0, 0.0, []
        for p in prompts:
            ids = torch.tensor([p])
            t = time.perf_counter()
            with torch.inference_mode():
                res = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                                      do_sample=False, eos_token_id=eos, **extra)
            seconds += time.perf_counter() - t
            new = res[0, len(p):].tolist()
            tokens += len(new)
            outputs.append(new)
        out[name] = {"tokens_per_s": tokens / seconds, "tokens": tokens, "outputs": outputs}
        print(f"  {name}: {tokens / seconds:.2f} tok/s", file=sys.stderr, flush=True)
    del target, draft
    gc.collect()
    return out


def our_mode(engine: Engine, prompts: list[list[int]], max_new: int, spec: SpecParams) -> dict:
    tokens, seconds, outputs, rounds = 0, 0.0, [], []
    for p in prompts:
        engine.reset()
        t = time.perf_counter()
        events = list(engine.generate(p, SamplingParams(max_new_tokens=max_new), spec))
        seconds += time.perf_counter() - t
        s = events[-1]
        assert isinstance(s, Summary)
        tokens += s.new_tokens
        outputs.append(list(s.token_ids))
        rounds += [e for e in events if isinstance(e, RoundEvent)]
    return {"tokens_per_s": tokens / seconds, "tokens": tokens, "outputs": outputs, "rounds": rounds}


def alpha_hat(rounds: list[RoundEvent]) -> float:
    """Per-token acceptance probability: accepted / (accepted + rejections)."""
    acc = sum(r.accepted for r in rounds)
    rej = sum(1 for r in rounds if r.accepted < len(r.drafted))
    return acc / (acc + rej) if acc + rej else 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", default=str(Path(__file__).resolve().parents[2] / "shared/bench/prompts.jsonl"))
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--limit", type=int, default=0, help="use only the first N prompts")
    ap.add_argument("--hf-modes", default="generate,assisted,prompt-lookup",
                    help="which transformers peers to run (comma-separated; empty for none)")
    ap.add_argument("--json", help="write all figures here")
    a = ap.parse_args()

    target_dir, draft_dir = (str(p) for p in default_pair())
    rows = read_prompts(a.prompts)[: a.limit or None]
    engine = Engine.load(target_dir, draft_dir, device="cpu")
    prompts = [engine.encode_chat(r["messages"]) for r in rows]
    print(f"{len(prompts)} prompts, {a.max_new_tokens} new tokens, K={a.k}, torch threads {torch.get_num_threads()}",
          file=sys.stderr)

    ours = {}
    for name, spec in [("ours plain", SpecParams(enabled=False)), ("ours draft", SpecParams(k=a.k)),
                       ("ours ngram", SpecParams(k=a.k, drafter="ngram"))]:
        our_mode(engine, prompts[:1], 4, spec)  # warm-up
        ours[name] = our_mode(engine, prompts, a.max_new_tokens, spec)
        print(f"  {name}: {ours[name]['tokens_per_s']:.2f} tok/s", file=sys.stderr, flush=True)
    # Per-step costs for alpha/c: a plain step, a K-token draft, a (K+1)-wide verify.
    plain_ms = sum(r.verify_ms for r in ours["ours plain"]["rounds"]) / len(ours["ours plain"]["rounds"])
    spec_rounds = [r for r in ours["ours draft"]["rounds"] if r.drafted]
    draft_ms_tok = sum(r.draft_ms for r in spec_rounds) / sum(len(r.drafted) for r in spec_rounds)
    verify_ms = sum(r.verify_ms for r in spec_rounds) / len(spec_rounds)
    del engine
    gc.collect()

    which = [m.strip() for m in a.hf_modes.split(",") if m.strip()]
    hf = hf_modes(target_dir, draft_dir, prompts, a.max_new_tokens, a.k, which) if which else {}
    results = ours | hf
    base = results["ours plain"]["outputs"]
    print(f"\n{'mode':<18}{'tok/s':>8}{'vs ours plain':>15}{'same tokens':>13}")
    for name, r in results.items():
        same = sum(o == b for o, b in zip(r["outputs"], base))
        print(f"{name:<18}{r['tokens_per_s']:>8.2f}{r['tokens_per_s'] / results['ours plain']['tokens_per_s']:>14.2f}x"
              f"{same:>9}/{len(base)}")

    alpha = alpha_hat(ours["ours draft"]["rounds"])
    c = draft_ms_tok / plain_ms
    bound = expected_speedup(alpha, a.k, c)
    width = verify_ms / plain_ms
    bound_w = (1 - alpha ** (a.k + 1)) / (1 - alpha) / (a.k * c + width) if alpha < 1 else (a.k + 1) / (a.k * c + width)
    ratios = {"speculative / ours plain": ours["ours draft"]["tokens_per_s"] / ours["ours plain"]["tokens_per_s"]}
    if {"hf generate", "hf assisted"} <= hf.keys():
        ratios |= {
            "ours plain / hf generate": ours["ours plain"]["tokens_per_s"] / hf["hf generate"]["tokens_per_s"],
            "speculative / hf assisted": ours["ours draft"]["tokens_per_s"] / hf["hf assisted"]["tokens_per_s"],
            "speculative / hf generate": ours["ours draft"]["tokens_per_s"] / hf["hf generate"]["tokens_per_s"],
        }
    print(f"\nalpha (per-token acceptance, draft model, K={a.k}) = {alpha:.3f}")
    print(f"plain step {plain_ms:.0f} ms, draft {draft_ms_tok:.0f} ms/token -> c = {c:.3f}; "
          f"verify of {a.k + 1} tokens {verify_ms:.0f} ms = {width:.2f} plain steps")
    print(f"Leviathan bound (1-a^(K+1))/((1-a)(1+Kc)) = {bound:.2f}x; with the measured verify width: {bound_w:.2f}x")
    for k_, v in ratios.items():
        print(f"{k_}: {v:.2f}x")
    print(f"machine: {platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
          f"torch {torch.__version__}, {date.today()}")
    if a.json:
        Path(a.json).write_text(json.dumps({
            "modes": {n: {"tokens_per_s": r["tokens_per_s"], "tokens": r["tokens"]} for n, r in results.items()},
            "ratios": ratios, "alpha": alpha, "c": c, "plain_ms": plain_ms, "verify_ms": verify_ms,
            "bound": bound, "bound_with_verify_width": bound_w, "k": a.k, "date": str(date.today()),
        }, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
