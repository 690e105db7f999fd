"""What the KV pool's element type costs and saves on the embedded pair: fp16 (a GGUF model's pool) against fp32, at
a few context lengths.

For each context it prefills the same prompt into an fp16 and an fp32 pool of each model, then times the C++ decoder
stack alone (all layers: attention over the cache included, the LM head not) for a one-token target step, a 5-token
target pass and a one-token draft step, the two pools taking turns round by round in one process (a host whose speed
drifts moves both alike). It prints the medians, their ratio, and the pool's bytes per position.

    python -m scripts.bench.kv_cache [--contexts 300,1000,2000] [--reps 15] [--threads 2]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from engine.io.loading import load_engine
from engine.io.provision import default_pair
from engine.model.forward import forward_chunked
from engine.model.kv_cache import BlockManager, KVPool
from engine.model.transformer import Transformer
from engine.cpu.machine import this_cpu
from engine.tools import results

DTYPES = (torch.float32, torch.float16)


def filled_pool(engine, model: Transformer, ids: list[int], dtype: torch.dtype) -> KVPool:
    c = engine.cache_cfg
    cfg = model.cfg
    pool = KVPool(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, BlockManager(c.blocks, c.block_size, c.max_seq_len),
                  dtype, "cpu")
    pool.manager.allocate(0)
    forward_chunked(model, pool, 0, ids, engine.device)
    return pool


def time_stack(model: Transformer, pools: dict[torch.dtype, KVPool], ids: list[int], rows: int,
               reps: int) -> dict[torch.dtype, float]:
    """Median ms of the stack over the last `rows` positions of ids, in each pool, taking turns."""
    times: dict[torch.dtype, list[float]] = {dt: [] for dt in pools}
    feed = torch.tensor(ids[-rows:])
    for i in range(reps):
        for dt in DTYPES if i % 2 == 0 else DTYPES[::-1]:
            m = pools[dt].manager
            m.truncate_to(0, len(ids) - rows)
            start, end = m.append(0, rows)
            view = pools[dt].view(0, start, end)
            x = model.embed(feed)
            t0 = time.perf_counter()
            model.stack(x, start, view)
            times[dt].append((time.perf_counter() - t0) * 1e3)
    return {dt: statistics.median(t) for dt, t in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--contexts", default="300,1000,2000")
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", type=int, default=2)
    results.add_arguments(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target, draft = default_pair()
    engine = load_engine(str(target), str(draft))
    engine.settle()
    print(f"CPU: {this_cpu().line()}")
    print(f"torch {torch.__version__}, {args.threads} threads, weights {engine.dtype_name}")
    for role, model in (("target", engine.target), ("draft", engine.draft)):
        cfg = model.cfg
        per_pos = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim
        print(f"{role}: KV {per_pos * 4 / 1024:.1f} KB a position in fp32, {per_pos * 2 / 1024:.1f} KB in fp16")
    prompt = engine.tokenizer.encode("def quicksort(items):\n    " * 1000)
    figures: dict = {"threads": args.threads, "stack_ms": {}}  # "<role>, <rows> rows, <ctx> positions": ms by pool
    for ctx in (int(c) for c in args.contexts.split(",")):
        ids = prompt[:ctx]
        for role, model, widths in (("target", engine.target, (1, 5)), ("draft", engine.draft, (1,))):
            pools = {dt: filled_pool(engine, model, ids, dt) for dt in DTYPES}
            for rows in widths:
                ms = time_stack(model, pools, ids, rows, args.reps)
                a, b = ms[torch.float32], ms[torch.float16]
                print(f"{role} stack, {rows} row(s) after {ctx} positions: fp32 pool {a:.2f} ms, fp16 pool {b:.2f} ms "
                      f"({(b / a - 1) * 100:+.1f}%)", flush=True)
                figures["stack_ms"][f"{role}, {rows} rows, {ctx} positions"] = {"fp32": a, "fp16": b}
    results.record(args, "scripts.bench.kv_cache", figures)


if __name__ == "__main__":
    main()
