"""The dense path on real weights: the embedded pair dequantized to fp32 tensors, as a folder of safetensors arrives
(engine.cpu.dense). The target runs on the kernels' F32 units; the draft either re-quantized to Q4_0 on the
kernels (the default) or int8 weight-only through torch (the path before). Greedy, the benchmark prompts; prints
each mode's decode rate, alpha, c and whether its tokens equal plain decoding's. Usage:
    python -m scripts.bench.dense_pair [--max-new-tokens 64] [--prompts 8]
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch

from engine.api.config import STOP_BELOW, CacheConfig, SamplingParams
from engine.io.loading import eos_ids, place
from engine.io.provision import default_pair
from engine.io.weights import load_checkpoint
from engine.cpu import machine as cpu
from engine.cpu.formats import T
from engine.runtime.engine import Engine
from engine.tools import results as records  # main's `results` are its modes'
from engine.tools.bench import read_prompts, run_mode
from engine.tools.bench_report import relate_to_plain

PROMPTS = Path(__file__).resolve().parents[3] / "shared" / "bench" / "prompts.jsonl"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-file", default=str(PROMPTS))
    records.add_arguments(ap)
    args = ap.parse_args()
    print(f"{cpu.this_cpu().line()}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    target_path, draft_path = default_pair()
    tgt, dft = load_checkpoint(target_path), load_checkpoint(draft_path)  # dequantized: fp32 tensors
    cache = CacheConfig(max_seq_len=2048)
    target = place(tgt, torch.float32, torch.device("cpu"), cache.max_seq_len, int8=False)
    drafts = {"Q4_0 on the kernels": place(dft, torch.float32, torch.device("cpu"), cache.max_seq_len, int8=True,
                                           requant=int(T.Q4_0)),
              "int8 through torch": place(dft, torch.float32, torch.device("cpu"), cache.max_seq_len, int8=True)}
    tok = tgt.tokenizer
    rows = read_prompts(args.prompt_file)[: args.prompts]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens)
    plain = None
    figures: dict = {"drafts": {}}
    for name, draft in drafts.items():
        engine = Engine(target, tok, draft, cache=cache, eos_ids=eos_ids(tgt))
        prompts = [engine.encode_chat(r["messages"]) for r in rows]
        results = [plain or run_mode(engine, prompts, "plain", 0, greedy),
                   run_mode(engine, prompts, "draft", 4, greedy, stop_below=STOP_BELOW)]
        relate_to_plain(results)
        plain = results[0]
        spec = results[1]
        same = sum(a == b for a, b in zip(spec.outputs, plain.outputs))
        print(f"plain {plain.tokens_per_s:.2f} tok/s; draft {name}, K <= 4 with the stop: "
              f"{spec.tokens_per_s:.2f} tok/s "
              f"({spec.tokens_per_s / plain.tokens_per_s:.2f}x plain), alpha {spec.alpha:.3f}, c {spec.c:.3f}, "
              f"tokens equal plain's on {same}/{len(prompts)} prompts", flush=True)
        figures["plain_tokens_per_s"] = plain.tokens_per_s
        figures["drafts"][name] = {"tokens_per_s": spec.tokens_per_s, "alpha": spec.alpha, "c": spec.c,
                                   "same_as_plain": same, "prompts": len(prompts)}
    records.record(args, "scripts.bench.dense_pair", figures)


if __name__ == "__main__":
    main()
