#!/usr/bin/env python
"""The drafters on text that repeats: the embedded pair asked to rewrite a 20-line function three ways (rename a
variable, add type hints, add docstrings), where most of the reply copies the prompt. Greedy, decode rates
(prefills left out) for plain decoding, the draft model, the n-gram lookup and the hybrid of the two; every
mode's tokens are checked against plain. The chat prompts of scripts/bench/cpu.py show the other side: little repeats.

    python -m scripts.bench.drafters [--max-new-tokens 200]
"""
from __future__ import annotations

import argparse
import sys

from engine.api.config import STOP_BELOW, SpecParams
from engine.io.loading import load_engine
from engine.io.provision import default_pair
from engine.tools import results
from scripts.bench.cpu import ModeRun

CODE = '''def merge_sorted(left, right):
    result = []
    i = j = 0
    while i < len(left) and j < len(right):
        if left[i] <= right[j]:
            result.append(left[i])
            i += 1
        else:
            result.append(right[j])
            j += 1
    result.extend(left[i:])
    result.extend(right[j:])
    return result


def merge_sort(items):
    if len(items) <= 1:
        return items
    middle = len(items) // 2
    return merge_sorted(merge_sort(items[:middle]), merge_sort(items[middle:]))
'''
ASKS = ("Rename the variable `result` to `merged` everywhere in this code and show the whole code again:",
        "Add type hints (list[int]) to every function in this code and show the whole code:",
        "Add a docstring to each function in this code and show the complete code:")
MODES = (("plain", SpecParams(enabled=False)),
         ("draft model K<=4 stop", SpecParams(k=4, stop_below=STOP_BELOW)),
         ("n-gram K=4", SpecParams(k=4, drafter="ngram")),
         ("hybrid K<=4 stop", SpecParams(k=4, drafter="hybrid", stop_below=STOP_BELOW)),
         ("n-gram K=8", SpecParams(k=8, drafter="ngram")),
         ("hybrid K<=8 stop", SpecParams(k=8, drafter="hybrid", stop_below=STOP_BELOW)))


def our_mode(engine, prompts: list[list[int]], max_new: int, spec: SpecParams) -> dict:
    """One mode over all prompts (scripts/bench/cpu.py's ModeRun, a prompt at a time)."""
    run = ModeRun(spec)
    for p in prompts:
        run.add(engine, p, max_new)
    return run.result()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--max-new-tokens", type=int, default=200)
    results.add_arguments(ap)
    a = ap.parse_args()
    target, draft = default_pair()
    engine = load_engine(str(target), str(draft), device="cpu")
    prompts = [engine.encode_chat([{"role": "user", "content": f"{ask}\n\n{CODE}"}]) for ask in ASKS]
    base = None
    figures = {}
    for name, spec in MODES:
        r = our_mode(engine, prompts, a.max_new_tokens, spec)
        base = base or r
        same = sum(o == b for o, b in zip(r["outputs"], base["outputs"]))
        print(f"{name:<22} {r['tokens_per_s']:6.2f} tok/s  {r['tokens_per_s'] / base['tokens_per_s']:.2f}x plain  "
              f"same tokens as plain: {same}/{len(prompts)}", flush=True)
        figures[name] = {"tokens_per_s": r["tokens_per_s"], "over_plain": r["tokens_per_s"] / base["tokens_per_s"],
                         "same_as_plain": same, "prompts": len(prompts)}
    results.record(a, "scripts.bench.drafters", figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
