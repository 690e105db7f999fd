"""Where a one-token step of the embedded pair goes: weight streaming, the rest of the decoder stack, the LM head,
sampling, the inspector's rows and Python, beside the memory floor of the weights the step reads.

For the target (and the draft) it times, in alternating rounds after a real prompt's prefill:
- `step`: what a plain round of the engine costs from the verify's start to its committed token (Engine._round's
  verify and accept/reject, as the engine calls them), inspector rows excluded;
- its parts: the embedding lookup, the C++ decoder stack (all layers and the final norm), the LM head, the
  sampling transform and draw, and the inspector's rows (timed on their own: the engine times them apart);
- `matmuls alone`: every layer's linear layers called one after another as the stack calls them (cold weights, as
  in a step); the stack's time minus this is attention, norms, rope, activation quantization and thread hand-offs;
  `of them <type>`: that time by block type, beside the type's megabytes (over several rows the types' costs part
  from their bytes: Q6_K's tile does more work per weight than Q4_K's);
- the memory floor: the bytes of packed weights one step reads (layers + LM head) over the read bandwidth measured
  here (a 2-thread sum over 512 MB), once in every round beside the step: on a host whose speed drifts, a step
  and a bandwidth measured minutes apart can put their ratio anywhere; `pass / floor` is the median of the
  rounds' own ratios.
For the draft it also times what drafting costs as the round loop runs it: `ModelDrafter.propose` of K tokens
(greedy, no early stop), per drafted token, beside the same K forward passes alone; the difference is the drafting
loop's own work (the argmax, the q rows, the inspector's logits, Python).

    python -m scripts.profile.step [--reps 30] [--context 200] [--threads 2]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from engine.api.config import SamplingParams
from engine.io.loading import load_engine
from engine.io.provision import default_pair
from engine.model.transformer import Transformer
from engine.cpu.formats import T
from engine.cpu.linear import QuantLinear
from engine.runtime.verify import decide, inspector_rows, score
from engine.tools import results
from scripts.bench.cpu import pass_costs
from scripts.bench.kernels import ReadBandwidth, cpu_line


def linears(model: Transformer) -> list[QuantLinear]:
    """The quantized linear layers a step runs through the stack, in order."""
    out = []
    for block in model.layers:
        for m in (block.attn.qkv, block.attn.o, block.mlp.gate_up, block.mlp.down):
            out.extend([m] if isinstance(m, QuantLinear) else list(m.parts))
    return out


def step_bytes(model: Transformer) -> int:
    head = model.lm_head
    return sum(lin.packed.numel() for lin in linears(model)) + (head.packed.numel() if isinstance(head, QuantLinear) else 0)


class Parts:
    """One named callable a round, timed in alternation with the others."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = {}

    def time(self, name: str, fn):
        t0 = time.perf_counter()
        out = fn()
        self.times.setdefault(name, []).append((time.perf_counter() - t0) * 1e3)
        return out

    def median(self, name: str) -> float:
        return statistics.median(self.times[name])


def profile(role: str, engine, model: Transformer, pool, seq: int, ids: list[int], reps: int, reader: ReadBandwidth,
            rows: int = 1) -> dict:
    """Prints the pass's parts; returns them, for the run's record."""
    params = SamplingParams(temperature=0.0)
    parts = Parts()
    m = pool.manager
    base = m.length(seq)
    text_of = engine.text_of
    vocab = engine.vocab
    layer_lins = linears(model)
    type_mb: dict[int, float] = {}  # the layers' weights by block type: which type a pass over several rows waits on
    for lin in layer_lins:
        type_mb[lin.qtype] = type_mb.get(lin.qtype, 0.0) + lin.packed.numel() / 1e6
    head_in = torch.randn(rows, model.cfg.hidden_size)
    bws: list[float] = []
    empty = torch.empty(0, dtype=torch.long)
    drafted = torch.tensor(ids[-rows:-1], dtype=torch.long)  # a verify pass scores the last token and rows - 1 drafts
    for _ in range(reps):
        m.truncate_to(seq, base)
        # The step as the engine runs it: score (embedding, stack, head, sampling transform) and decide.
        scores = parts.time("step", lambda: score(model, pool, ids, drafted, params, vocab, engine.device))
        bws.append(reader.once())
        if rows == 1:  # a plain step's decide and inspector rows (a verify pass's need the draft's q)
            verdict = parts.time("  then decide", lambda: decide(empty, None, scores.p, None)[2])
            parts.time("inspector rows (apart)", lambda: inspector_rows(scores, empty, None, verdict, text_of, True))
        m.truncate_to(seq, base)
        feed = torch.tensor(ids[-rows:])
        start, end = m.append(seq, rows)
        view = pool.view(seq, start, end)
        x = parts.time("embedding", lambda: model.embed(feed))
        h = parts.time("decoder stack (C++)", lambda: model.stack(x, start, view))
        logits = parts.time("LM head", lambda: model.lm_head(h).float())
        parts.time("sampling transform + draw", lambda: decide(empty, None, params_probs(logits[:1], params), None))
        acts, by_type = {}, {}
        for lin in layer_lins:  # the stack's matmuls one by one, same inputs width, cold weights
            a = acts.setdefault(lin.in_features, torch.randn(rows, lin.in_features))
            t0 = time.perf_counter()
            lin(a)
            kind = f"  of them {T(lin.qtype).name} ({type_mb[lin.qtype]:.0f} MB)"
            by_type[kind] = by_type.get(kind, 0.0) + time.perf_counter() - t0
        parts.times.setdefault("matmuls alone (layers)", []).append(sum(by_type.values()) * 1e3)
        for kind, seconds in by_type.items():
            parts.times.setdefault(kind, []).append(seconds * 1e3)
        parts.time("LM head alone", lambda: model.lm_head(head_in))
    m.truncate_to(seq, base)
    bw = statistics.median(bws)
    floor = step_bytes(model) / bw / 1e6
    print(f"\n== {role}: {len(model.layers)} layers, a pass of {rows} token(s) after {base}, median ms of {reps} rounds ==")
    for name in parts.times:
        print(f"  {name:<34} {parts.median(name):8.2f}")
    stack = parts.median("decoder stack (C++)")
    mat = parts.median("matmuls alone (layers)")
    print(f"  {'stack minus its matmuls':<34} {stack - mat:8.2f}   (attention, norms, rope, act. quantization, hand-offs)")
    print(f"  {'memory floor':<34} {floor:8.2f}   ({step_bytes(model) / 1e6:.0f} MB of weights at {bw:.1f} GB/s)")
    ratios = [t * b * 1e6 / step_bytes(model) for t, b in zip(parts.times["step"], bws)]
    print(f"  {'pass / floor':<34} {statistics.median(ratios):8.2f}   (median of the rounds' own, "
          f"{min(ratios):.2f}-{max(ratios):.2f})")
    return {"rows": rows, "context": base, "ms": {name.strip(): parts.median(name) for name in parts.times},
            "read_gbs": bw, "floor_ms": floor, "pass_over_floor": statistics.median(ratios)}


def profile_propose(drafter, ids: list[int], reps: int, k: int = 4) -> dict:
    """ms per drafted token of propose(k) and of its k forward passes alone, alternating, from the same cache."""
    from engine.api.config import SpecParams
    from engine.model.forward import forward_chunked

    params, times = SamplingParams(temperature=0.0), {"propose": [], "forward passes alone": []}
    drafter.configure(SpecParams(k=k, stop_below=0.0))
    for _ in range(reps):
        drafter._sync(ids)
        t0 = time.perf_counter()
        drafter.propose(ids, k, params, None)
        times["propose"].append((time.perf_counter() - t0) / k * 1e3)
        drafter._sync(ids)
        feed = ids[len(drafter.cached):]
        t0 = time.perf_counter()
        for _ in range(k):
            forward_chunked(drafter.model, drafter.pool, drafter.seq, feed, drafter.device, head_rows=True)
            drafter.cached.extend(feed)
            feed = [ids[-1]]
        times["forward passes alone"].append((time.perf_counter() - t0) / k * 1e3)
    drafter._sync(ids)
    print(f"\n== draft: propose of K = {k} (greedy, no early stop), median ms per drafted token of {reps} rounds ==")
    for name, t in times.items():
        print(f"  {name:<34} {statistics.median(t):8.2f}")
    rest = statistics.median(times["propose"]) - statistics.median(times["forward passes alone"])
    print(f"  {'the drafting loop beyond them':<34} {rest:8.2f}   (argmax, q rows, the inspector's logits, Python)")
    return {"k": k, "ms_per_drafted_token": {name: statistics.median(t) for name, t in times.items()}}


def params_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    from engine.spec.sampling import probs_for_positions

    return probs_for_positions(logits, params, torch.empty(0, dtype=torch.long), torch.empty(0, dtype=torch.long))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--context", type=int, default=200, help="prompt tokens in the caches before the timed steps")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", default="1", help="pass widths to profile, e.g. 1,5,9 (a verify pass of K = rows - 1)")
    results.add_arguments(ap)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    target, draft = default_pair()
    engine = load_engine(str(target), str(draft))
    engine.settle()  # the steady state: the weights on huge pages where the kernel allows
    print(f"CPU: {cpu_line()}")
    print(f"torch {torch.__version__}, {args.threads} threads, weights {engine.dtype_name}")
    reader = ReadBandwidth()
    reader.once()  # the first read faults the pages in
    text = "def quicksort(items):\n    " * (args.context // 8)
    ids = engine.tokenizer.encode(text)[: args.context]
    engine._prefill(ids)
    figures: dict = {"threads": args.threads, "target": {}}
    for rows in (int(r) for r in args.rows.split(",")):
        figures["target"][rows] = profile("target (1.5B)", engine, engine.target, engine.target_pool, 0, ids,
                                          args.reps, reader, rows)
    drafter = engine.model_drafter
    if drafter is not None:
        drafter._sync(ids)
        drafter._prefill(ids)
        figures["draft"] = profile("draft (0.5B)", engine, engine.draft, drafter.pool, drafter.seq, ids, args.reps,
                                   reader)
        figures["propose"] = profile_propose(drafter, ids, args.reps)
    # Each width above ran in its own minutes; in steps, a pass compares only with a step timed beside it.
    costs = pass_costs(engine, ids, repeats=args.reps)
    print("\n== target passes in one-token passes, the widths taking turns (median of " + f"{args.reps} rounds) ==")
    print("  " + ", ".join(f"{w}: {ms:.1f} ms = {ms / costs[1]:.2f}" for w, ms in costs.items()))
    figures["target_pass_ms"] = costs
    figures["target_pass_steps"] = {w: ms / costs[1] for w, ms in costs.items()}
    results.record(args, "scripts.profile.step", figures)


if __name__ == "__main__":
    main()
