"""The engine's forward passes on a GPU, at the embedded pair's shapes (random bf16 weights: the GGUFs cannot
travel to a lent GPU machine, and a pass's cost does not depend on the weights' values).

Prints, for the target (Qwen2.5-1.5B's shapes) and the draft (0.5B's), run eagerly and as replayed CUDA graphs
(engine.model.step_graphs), side by side in one process: a one-token step in ms, passes of 2..16 tokens in steps,
the first pass of each length (which captures its graph), how many rows of a pass differ bitwise from one-token
steps, and how far the graphs' logits are from the eager ones. Then the whole engine over the two models (a
character tokenizer, greedy, no EOS): ms per round and per token, plain and speculative, against the passes alone,
which is what the engine spends outside the model (--profile instead: the passes' device time kernel by kernel,
eager and replayed, from torch.profiler). With random weights the draft model's tokens are rarely
accepted; the n-gram drafter's are, on a repetitive prompt. With --padding, the earlier study: every matmul and
norm padded to 16 rows, one row padded to two, or none, and which row counts give F.linear's rows the same bits.
Usage:
    python -m scripts.bench.gpu [--reps 30] [--context 200] [--max-len 4096] [--tokens 96] [--padding] [--profile]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from engine.api.config import CacheConfig, ModelConfig, SamplingParams, SpecParams
from engine.api.events import Summary
from engine.io.weights import expected_shapes
from engine.model.kv_cache import BlockManager, KVPool
from engine.model.row_padding import RowPadded, pad_short_passes
from engine.model.step_graphs import StepGraphs
from engine.model.transformer import Transformer
from engine.runtime.engine import Engine
from engine.tools import results
from tests.tiny import tiny_tokenizer

QWEN25 = dict(model_type="qwen2", vocab_size=151936, num_attention_heads=0, num_key_value_heads=2, rms_norm_eps=1e-6,
              rope_theta=1000000.0, max_position_embeddings=32768, tie_word_embeddings=True, bos_token_id=151643,
              eos_token_id=151645)
SHAPES = {
    "target (1.5B shapes)": dict(QWEN25, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                 num_attention_heads=12),
    "draft (0.5B shapes)": dict(QWEN25, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                                num_attention_heads=14),
}
PASSES = (1, 2, 3, 5, 9, 16)
DEVICE = "cuda"  # --smoke runs the script's code on the CPU with two layers, to check it before a GPU is lent
MAX_LEN = 4096  # the app's default context: a captured pass attends over all of it


def sync() -> None:
    if DEVICE == "cuda":
        torch.cuda.synchronize()


def random_model(cfg: ModelConfig, seed: int) -> Transformer:
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    sd = {name: torch.randn(shape, generator=g, device=DEVICE, dtype=torch.bfloat16)
          * (1.0 if len(shape) == 1 else 0.02)
          for name, shape in expected_shapes(cfg).items()}
    return Transformer.from_state_dict(cfg, sd, torch.bfloat16, DEVICE, MAX_LEN)


def pad_all(model: Transformer) -> int:
    """Undo the load's probed padding and wrap every module, so each mode below is a setting of `rows`.
    -> how many the load had padded on this device."""
    probed = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, RowPadded):
                setattr(parent, name, child.inner)
                probed += 1
    pad_short_passes(model, probe=False)
    return probed


def set_padding(model: Transformer, rows: int) -> None:
    for m in model.modules():
        if isinstance(m, RowPadded):
            m.rows = rows  # 1: every pass runs as it is


def fresh(model: Transformer, context: list[int]) -> KVPool:
    c = model.cfg
    manager = BlockManager(-(-MAX_LEN // 16), 16, MAX_LEN)
    pool = KVPool(c.num_layers, c.num_kv_heads, c.head_dim, manager, torch.bfloat16, DEVICE)
    pool.manager.allocate(0)
    feed(model, pool, context)
    return pool


def feed(model: Transformer, pool: KVPool, ids: list[int]) -> torch.Tensor:
    start, end = pool.manager.append(0, len(ids))
    return model(torch.tensor(ids, device=DEVICE), start, pool.view(0, start, end))  # (T, V)


def pass_ms(model: Transformer, pool: KVPool, n: int, reps: int) -> float:
    times = []
    base = pool.manager.length(0)
    for r in range(reps + 3):
        sync()
        t0 = time.perf_counter()
        feed(model, pool, list(range(7, 7 + n)))
        sync()
        if r >= 3:
            times.append((time.perf_counter() - t0) * 1e3)
        pool.manager.truncate_to(0, base)  # the rollback: every rep at the same depth
    return statistics.median(times)


def rows_differing(model: Transformer, context: list[int], n: int) -> tuple[int, int]:
    """(rows not bitwise equal, rows whose argmax differs) between one pass of n and n one-token steps."""
    ids = list(range(300, 300 + n))
    together = feed(model, fresh(model, context), ids)
    pool = fresh(model, context)
    steps = torch.cat([feed(model, pool, [t]) for t in ids])
    same = (together == steps).all(dim=-1)
    return int((~same).sum()), int((together.argmax(-1) != steps.argmax(-1)).sum())


def set_graphs(model: Transformer, on: bool) -> None:
    model.graphs = StepGraphs(capture=DEVICE == "cuda") if on else None


def first_passes_ms(model: Transformer, pool: KVPool) -> dict[int, float]:
    """The first pass of each length: with graphs, its capture."""
    out = {}
    base = pool.manager.length(0)
    for n in PASSES:
        sync()
        t0 = time.perf_counter()
        feed(model, pool, list(range(7, 7 + n)))
        sync()
        out[n] = (time.perf_counter() - t0) * 1e3
        pool.manager.truncate_to(0, base)
    return out


def graphs_vs_eager(model: Transformer, context: list[int]) -> str:
    """The same 5-token pass eagerly, through the fixed-shape passes uncaptured, and replayed from a graph."""
    ids = list(range(300, 305))
    out = {}
    for mode in ("eager", "uncaptured", "graphs"):
        capture = mode == "graphs" and DEVICE == "cuda"
        model.graphs = None if mode == "eager" else StepGraphs(capture=capture)
        out[mode] = feed(model, fresh(model, context), ids)
    diff = (out["graphs"] - out["eager"]).abs().max().item()
    flips = int((out["graphs"].argmax(-1) != out["eager"].argmax(-1)).sum())
    same = torch.equal(out["graphs"], out["uncaptured"])
    return (f"max |logit difference| {diff:.3g}, rows whose argmax differs {flips} of 5; "
            f"replayed bitwise equal to uncaptured: {same}")


def modes(model: Transformer, name: str, context: list[int], reps: int,
          figures: dict | None = None) -> dict[str, float]:
    steps = {}
    for mode in ("eager", "graphs"):
        set_graphs(model, mode == "graphs")
        pool = fresh(model, context)
        first = first_passes_ms(model, pool)
        ms = {n: pass_ms(model, pool, n, reps) for n in PASSES}
        steps[mode] = ms[1]
        costs = "  ".join(f"{n}: {ms[n] / ms[1]:.2f}" for n in PASSES[1:])
        print(f"{name}, {mode}: step {ms[1]:.2f} ms; pass of n tokens, in steps: {costs}")
        print("    first pass of each length, ms: " + "  ".join(f"{n}: {first[n]:.0f}" for n in PASSES))
        diff = "  ".join("n={}: {} rows, {} argmax".format(n, *rows_differing(model, context, n))
                         for n in (2, 5, 9, 16))
        print(f"    rows differing from one-token steps: {diff}")
        if figures is not None:
            figures[f"{name}, {mode}"] = {"step_ms": ms[1], "pass_steps": {n: ms[n] / ms[1] for n in PASSES},
                                          "first_pass_ms": first}
    print(f"    graphs against eager: {graphs_vs_eager(model, context)}")
    print(f"    one-token step, eager / graphs: {steps['eager'] / steps['graphs']:.1f}x")
    return steps


def padding_study(model: Transformer, name: str, context: list[int], reps: int, figures: dict | None = None) -> None:
    set_graphs(model, False)
    pad_all(model)
    for rows in (16, 2, 1):
        set_padding(model, rows)
        pool = fresh(model, context)
        ms = {n: pass_ms(model, pool, n, reps) for n in PASSES}
        label = {16: "all padded to 16 rows", 2: "one row padded to 2", 1: "unpadded"}[rows]
        costs = "  ".join(f"{n}: {ms[n] / ms[1]:.2f}" for n in PASSES[1:])
        print(f"{name}, eager, {label}: step {ms[1]:.2f} ms; pass of n tokens, in steps: {costs}")
        if figures is not None:
            figures[f"{name}, eager, {label}"] = {"step_ms": ms[1], "pass_steps": {n: ms[n] / ms[1] for n in PASSES}}
        diff = "  ".join("n={}: {} rows, {} argmax".format(n, *rows_differing(model, context, n))
                         for n in (2, 5, 9, 16))
        print(f"    rows differing from one-token steps: {diff}")
    set_padding(model, 1)  # back to as the engine runs it


def kernel_profile(model: Transformer, name: str, context: list[int], reps: int, top: int = 12) -> dict:
    """Where a pass's device time goes, kernel by kernel: `reps` one-token steps and 5-token passes under
    torch.profiler, eagerly and replayed from graphs (the same kernels: a replay saves their launches, not their
    time). On the CPU (--smoke) the profile is of CPU ops and says nothing about a GPU."""
    from torch.profiler import ProfilerActivity, profile

    activity = ProfilerActivity.CUDA if DEVICE == "cuda" else ProfilerActivity.CPU
    totals = {}  # device µs and kernels a pass, by mode and length: the record's figures
    for mode in ("eager", "graphs"):
        set_graphs(model, mode == "graphs")
        pool = fresh(model, context)
        for n in (1, 5):
            pass_ms(model, pool, n, 2)  # warm: the graph of this length captured before the profile
            base, ids = pool.manager.length(0), list(range(7, 7 + n))
            with profile(activities=[activity]) as prof:
                for _ in range(reps):
                    feed(model, pool, ids)
                    pool.manager.truncate_to(0, base)
                sync()
            rows = [(_own_us(e), e.count, e.key) for e in prof.key_averages()
                    if (DEVICE == "cpu" or e.device_type.name == "CUDA") and _own_us(e) > 0]
            rows.sort(reverse=True)
            total = sum(us for us, _, _ in rows)
            what = "kernels" if DEVICE == "cuda" else "CPU ops"
            print(f"{name}, {mode}, pass of {n}: {total / reps:.0f} us of device time a pass in "
                  f"{sum(c for _, c, _ in rows) / reps:.0f} {what}; the {top} largest:")
            for us, count, key in rows[:top]:
                print(f"    {us / reps:8.1f} us {100 * us / total:5.1f}%  x{count / reps:<5.0f} {key[:90]}")
            totals[f"{name}, {mode}, pass of {n}"] = {"device_us": total / reps,
                                                      "kernels": sum(c for _, c, _ in rows) / reps}
    set_graphs(model, True)
    return totals


def _own_us(event) -> float:
    """An op's own time on its device (µs, over the profile): the kernel time under CUDA, the CPU time on the CPU."""
    if DEVICE == "cpu":
        return event.self_cpu_time_total
    return getattr(event, "self_device_time_total", None) or getattr(event, "self_cuda_time_total", 0.0)


def engine_rounds(target: Transformer, draft: Transformer, tokens: int) -> dict:
    """The engine's rounds, plain and speculative, with graphs: time per round against the passes it runs."""
    cache = CacheConfig(block_size=16, max_seq_len=MAX_LEN)
    engine = Engine(target, tiny_tokenizer(), draft, cache=cache, eos_ids=set())
    prompt = engine.encode_chat([{"role": "user", "content": "abc abc abc abc abc abc abc abc abc abc abc abc"}])
    greedy = SamplingParams(temperature=0.0, max_new_tokens=tokens)
    out = {}
    for label, spec in (("plain", SpecParams(enabled=False)), ("draft model, K=4", SpecParams(k=4)),
                        ("n-gram, K=4", SpecParams(k=4, drafter="ngram"))):
        for _ in range(2):  # the first request captures the graphs it needs
            engine.reset()
            *_, summary = engine.generate(prompt, greedy, spec)
        assert isinstance(summary, Summary)
        decode_ms = summary.new_tokens / summary.tokens_per_s * 1e3
        per_round = decode_ms / summary.rounds
        print(f"engine, {label}: {summary.new_tokens / decode_ms * 1e3:.0f} tok/s, {per_round:.2f} ms a round "
              f"({summary.mean_tokens_per_round:.2f} tokens; draft {summary.draft_ms / summary.rounds:.2f} ms, verify "
              f"{summary.verify_ms / summary.rounds:.2f} ms; accepted {summary.accepted} of {summary.drafted})")
        out[label] = {"tokens_per_s": summary.new_tokens / decode_ms * 1e3, "ms_a_round": per_round,
                      "tokens_a_round": summary.mean_tokens_per_round, "accepted": summary.accepted,
                      "drafted": summary.drafted}
    return out


def main() -> None:
    global DEVICE, MAX_LEN
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--context", type=int, default=200, help="positions in the cache before each timed pass")
    ap.add_argument("--max-len", type=int, default=MAX_LEN, help="the cache's length, which a graph attends over")
    ap.add_argument("--tokens", type=int, default=96, help="new tokens per engine request")
    ap.add_argument("--padding", action="store_true", help="also the eager row-padding study")
    ap.add_argument("--profile", action="store_true", help="only the kernel-level profile of passes (torch.profiler)")
    ap.add_argument("--smoke", action="store_true", help="two layers on the CPU: checks the script, measures nothing "
                    "(and writes no record)")
    results.add_arguments(ap)
    args = ap.parse_args()
    MAX_LEN = args.max_len
    if args.smoke:
        DEVICE = "cpu"
        for raw in SHAPES.values():
            raw["num_hidden_layers"] = 2
    elif not torch.cuda.is_available():
        sys.exit("no CUDA device: this benchmark needs a GPU")
    name = torch.cuda.get_device_name() if DEVICE == "cuda" else "cpu (smoke: graphs run uncaptured)"
    print(f"device: {name}, torch {torch.__version__}, bf16; cache {MAX_LEN} positions, {args.context} filled")
    context = list(range(1000, 1000 + args.context))
    step, models = {}, {}
    figures: dict = {"passes": {}}
    for name, raw in SHAPES.items():
        model = random_model(ModelConfig.from_hf(raw), seed=len(name))
        probed = sum(isinstance(m, RowPadded) for m in model.modules())
        print(f"{name}: the load's probe padded {probed} of {6 * len(model.layers) + 2} matmuls and norms")
        if args.profile:
            figures["passes"] |= kernel_profile(model, name, context, args.reps)
            continue
        step[name] = modes(model, name, context, args.reps, figures["passes"])
        if args.padding:
            padding_study(model, name, context, args.reps, figures["passes"])
        set_graphs(model, True)
        models[name] = model
    if args.profile:
        if not args.smoke:  # a smoke run measures nothing
            results.record(args, "scripts.bench.gpu", figures, device=DEVICE)
        return
    target, draft = list(SHAPES)
    for mode in ("eager", "graphs"):
        print(f"draft step / target step, {mode} (c at one drafted token a step): "
              f"{step[draft][mode] / step[target][mode]:.2f}")
    figures["c_one_token"] = {mode: step[draft][mode] / step[target][mode] for mode in ("eager", "graphs")}
    figures["engine"] = engine_rounds(models[target], models[draft], args.tokens)
    if args.padding:
        probe_linear(ModelConfig.from_hf(SHAPES[target]))
    if not args.smoke:
        results.record(args, "scripts.bench.gpu", figures, device=DEVICE)


def probe_linear(cfg: ModelConfig) -> None:
    """Which row counts give a row the same bits as F.linear does on its own (row 0 of M = 1..16)."""
    h, q, kv = cfg.hidden_size, cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
    i = cfg.intermediate_size
    for n, k in ((q + 2 * kv, h), (h, q), (2 * i, h), (h, i), (cfg.vocab_size, h)):
        w = torch.randn(n, k, device=DEVICE, dtype=torch.bfloat16) * 0.02
        x = torch.randn(16, k, device=DEVICE, dtype=torch.bfloat16)
        classes: list[list[int]] = []
        for m in range(1, 17):
            row = torch.nn.functional.linear(x[:m], w)[0]
            for c in classes:
                if torch.equal(torch.nn.functional.linear(x[: c[0]], w)[0], row):
                    c.append(m)
                    break
            else:
                classes.append([m])
        print(f"F.linear {k}->{n}: row counts giving row 0 the same bits: {classes}")


if __name__ == "__main__":
    main()
