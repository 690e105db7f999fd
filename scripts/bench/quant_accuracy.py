"""What quantizing activations to int8 inside the kernels costs the model.

For each benchmark prompt (chat template applied) plus the reply the exact model writes to it (greedy), both
builds of the same GGUF score every position: activations in fp32 (exact: only the file's weights are
quantized) and in int8 per 32 inputs (the default kernels). Prints the top-1 agreement of the next-token
choice and the mean KL(exact || int8) of the next-token distributions.

    python -m scripts.bench.quant_accuracy [--model target|draft] [--new-tokens 64]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from engine.api.config import CacheConfig, SamplingParams, SpecParams
from engine.io.gguf_file import GGUFFile
from engine.io.gguf_model import build_model
from engine.io.gguf_tokenizer import tokenizer_from_gguf
from engine.io.provision import default_pair
from engine.model.kv_cache import BlockManager, KVPool
from engine.runtime.engine import Engine
from engine.tools import results
from engine.tools.bench import read_prompts

SHARED = Path(__file__).resolve().parents[3] / "shared" / "bench"
MAX_LEN = 2048


def score(model, ids: list[int]) -> torch.Tensor:
    """log-probabilities of the next token at every position, (T, V), computed in chunks of 256."""
    c = model.cfg
    pool = KVPool(c.num_layers, c.num_kv_heads, c.head_dim, BlockManager(MAX_LEN // 16 + 2, 16, MAX_LEN),
                  torch.float32, "cpu")
    pool.manager.allocate(0)
    out = []
    for i in range(0, len(ids), 256):
        chunk = ids[i:i + 256]
        start, end = pool.manager.append(0, len(chunk))
        out.append(torch.log_softmax(model(torch.tensor(chunk), start, pool.view(0, start, end)), dim=-1))
    return torch.cat(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", default=str(SHARED / "prompts.jsonl"))
    ap.add_argument("--model", choices=("target", "draft"), default="target")
    ap.add_argument("--new-tokens", type=int, default=48, help="greedy reply tokens scored after each prompt")
    results.add_arguments(ap)
    a = ap.parse_args()

    path = default_pair()[0 if a.model == "target" else 1]
    gf = GGUFFile(path)
    tok = tokenizer_from_gguf(path, gf.metadata)
    exact, fast = build_model(gf, MAX_LEN, act="fp32"), build_model(gf, MAX_LEN, act="int8")
    writer = Engine(exact, tok, cache=CacheConfig(max_seq_len=MAX_LEN), eos_ids={tok.eos_token_id})
    greedy = SamplingParams(max_new_tokens=a.new_tokens)
    agree = total = 0
    kl_sum = 0.0
    with torch.inference_mode():
        for row in read_prompts(a.prompts):
            prompt = list(tok.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=True)["input_ids"])
            writer.reset()
            *_, reply = writer.generate(prompt, greedy, SpecParams(enabled=False))  # the exact model's own reply
            ids = prompt + list(reply.token_ids)
            p, q = score(exact, ids), score(fast, ids)
            agree += int((p.argmax(-1) == q.argmax(-1)).sum())
            kl_sum += float((p.exp() * (p - q)).sum(-1).sum())
            total += len(ids)
            print(f"  {row.get('id', '?')}: {len(ids)} positions; so far top-1 agreement {agree / total:.4f}, "
                  f"mean KL {kl_sum / total:.2e}", file=sys.stderr, flush=True)
    print(f"{path.name}: {total} positions over {len(read_prompts(a.prompts))} prompts; int8 vs exact activations: "
          f"top-1 agreement {agree / total:.4f}, mean KL {kl_sum / total:.2e} nats")
    results.record(a, "scripts.bench.quant_accuracy", {"model": path.name, "positions": total,
                                                       "top1_agreement": agree / total, "mean_kl_nats": kl_sum / total})
    return 0


if __name__ == "__main__":
    sys.exit(main())
