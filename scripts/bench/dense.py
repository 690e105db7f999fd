"""A dense model (a folder of safetensors) on the CPU: oneDNN's prepacked fp32 matmuls against the kernels' F32
units (BF16 with --bf16) and the C++ stack (engine.cpu.dense), or with --draft a draft's torch int8 weight-only
matmuls against Q4_0 units on the kernels, at Llama-3.2-1B's shapes with random weights (a pass's cost does not depend on the values).
Prints each way's one-token step, its passes of 2..9 tokens in steps, and how many rows of a pass differ bitwise
from one-token steps. The two take turns, pass by pass. Usage:
    python -m scripts.bench.dense [--reps 9] [--layers 16] [--context 200] [--bf16] [--draft]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from engine.api.config import ModelConfig
from engine.io.weights import expected_shapes
from engine.model.cpu_linear import Int8Linear, PackedLinear, swap_linears
from engine.model.kv_cache import BlockManager, KVPool
from engine.model.transformer import Transformer
from engine.cpu import machine as cpu
from engine.tools import results
from engine.cpu.dense import run_on_kernels
from engine.cpu.formats import T

LLAMA32_1B = dict(model_type="llama", vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                  num_attention_heads=32, num_key_value_heads=8, head_dim=64, rms_norm_eps=1e-5, rope_theta=500000.0,
                  rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                "original_max_position_embeddings": 8192},
                  max_position_embeddings=131072, tie_word_embeddings=True, bos_token_id=128000, eos_token_id=128009)
PASSES = (1, 2, 3, 5, 9)


def build(cfg: ModelConfig, how: str, bf16: bool) -> Transformer:
    g = torch.Generator().manual_seed(0)
    sd = {n: torch.randn(s, generator=g) * (1.0 if len(s) == 1 else 0.02) for n, s in expected_shapes(cfg).items()}
    if bf16:  # a bf16 checkpoint's values (the kernels then keep them as BF16 units)
        sd = {n: t.to(torch.bfloat16).float() for n, t in sd.items()}
    model = Transformer.from_state_dict(cfg, sd, torch.float32, "cpu", 1024)
    del sd
    if how in ("f32", "q4_0"):
        assert run_on_kernels(model, T.Q4_0 if how == "q4_0" else None), "the kernels did not build here"
        return model
    return swap_linears(model, Int8Linear if how == "int8" else PackedLinear)


def fresh(model: Transformer, context: list[int]) -> KVPool:
    c = model.cfg
    pool = KVPool(c.num_layers, c.num_kv_heads, c.head_dim, BlockManager(64, 16, 1024), torch.float32, "cpu")
    pool.manager.allocate(0)
    feed(model, pool, context)
    return pool


def feed(model: Transformer, pool: KVPool, ids: list[int]) -> torch.Tensor:
    start, end = pool.manager.append(0, len(ids))
    return model(torch.tensor(ids), start, pool.view(0, start, end))  # (T, V)


def timed(model: Transformer, pool: KVPool, n: int) -> float:
    base = pool.manager.length(0)
    t0 = time.perf_counter()
    feed(model, pool, list(range(7, 7 + n)))
    ms = (time.perf_counter() - t0) * 1e3
    pool.manager.truncate_to(0, base)  # every rep at the same depth
    return ms


def rows_differing(model: Transformer, context: list[int], n: int) -> int:
    ids = list(range(300, 300 + n))
    together = feed(model, fresh(model, context), ids)
    pool = fresh(model, context)
    steps = torch.cat([feed(model, pool, [t]) for t in ids])
    return int((~(together == steps).all(dim=-1)).sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--layers", type=int, default=16, help="decoder layers (16: the whole 1B model)")
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--bf16", action="store_true", help="weights that are bf16 values, as a bf16 checkpoint's are")
    ap.add_argument("--draft", action="store_true",
                    help="a draft's ways instead: int8 weight-only through torch against Q4_0 on the kernels")
    results.add_arguments(ap)
    args = ap.parse_args()
    cfg = ModelConfig.from_hf(dict(LLAMA32_1B, num_hidden_layers=args.layers))
    print(f"{cpu.this_cpu().line()}; torch {torch.__version__}, {torch.get_num_threads()} threads; "
          f"Llama-3.2-1B shapes, {args.layers} layers, random {'bf16' if args.bf16 else 'fp32'} weights, "
          f"{args.context} positions cached")
    ways = ({"torch int8 weight-only": "int8", "kernels Q4_0 + C++ stack": "q4_0"} if args.draft else
            {"oneDNN prepacked": "onednn", f"kernels {'BF16' if args.bf16 else 'F32'} + C++ stack": "f32"})
    models = {name: build(cfg, how, args.bf16) for name, how in ways.items()}
    context = list(range(1000, 1000 + args.context))
    pools = {name: fresh(m, context) for name, m in models.items()}
    times: dict[tuple[str, int], list[float]] = {}
    for _ in range(args.reps + 1):  # the first round warms up and is dropped below
        for n in PASSES:
            for name, m in models.items():
                times.setdefault((name, n), []).append(timed(m, pools[name], n))
    figures = {}
    for name, m in models.items():
        ms = {n: statistics.median(times[name, n][1:]) for n in PASSES}
        steps = "  ".join(f"{n}: {ms[n] / ms[1]:.2f}" for n in PASSES[1:])
        differing = {n: rows_differing(m, context, n) for n in (2, 5, 9)}
        diff = "  ".join(f"n={n}: {d}" for n, d in differing.items())
        print(f"{name}: step {ms[1]:.1f} ms; pass of n tokens, in steps: {steps}; rows differing from steps: {diff}")
        figures[name] = {"step_ms": ms[1], "pass_steps": {n: ms[n] / ms[1] for n in PASSES},
                         "rows_differing": differing}
    results.record(args, "scripts.bench.dense", figures)


if __name__ == "__main__":
    main()
