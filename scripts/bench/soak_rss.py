"""Where the engine's resident memory goes over a long chat session: the embedded pair driven turn by turn, with
the RSS printed beside the part of it that is KV cache pages.

    python -m scripts.bench.soak_rss [TURNS] [TURNS_PER_CHAT]      # defaults 300 and 50

Each turn appends a user message to the conversation and asks for a short reply (16 new tokens, draft model,
K 4; greedy and sampled in turn); every TURNS_PER_CHAT turns is a New chat (Engine.reset). Every 10 turns it
prints the process's RSS, the resident part of the four KV tensors (target and draft, K and V: lazily zeroed
pages, engine/model/pages.py; counted page by page from /proc/self/pagemap), the rest, the positions the
conversation holds and the high-water mark of blocks in use. If the KV pages account for the rise, "rest" stays
flat and the KV part follows the longest conversation so far.
"""
import argparse
import os
import sys
import time

from engine.tools import results

MB = 1 << 20
PROMPTS = ["Write a Python function that {} and explain it in one sentence.",
           "Now rewrite it so that it {}.", "What is the time complexity if it {}?"]
TASKS = ["reverses a list", "counts words", "checks for a palindrome", "merges two sorted lists",
         "finds the median", "removes duplicates", "flattens nested lists", "parses a CSV line"]


def resident(ranges: list[tuple[int, int]]) -> int:
    """Bytes of the given address ranges [start, end) that are in memory, from /proc/self/pagemap (bit 63 of a
    page's entry: present). Exact to the page, where a mapping's Rss in smaps is not: the kernel merges adjacent
    anonymous mappings, so the VMA holding a KV tensor also holds other allocations."""
    page = os.sysconf("SC_PAGE_SIZE")
    total = 0
    with open("/proc/self/pagemap", "rb") as f:
        for start, end in ranges:
            first, last = start // page, (end - 1) // page
            f.seek(first * 8)
            entries = memoryview(f.read((last - first + 1) * 8)).cast("Q")
            total += sum(1 for e in entries if e >> 63) * page
    return total


def rss() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))


def pools(engine) -> dict:
    out = {"target": engine.target_pool}
    if engine.model_drafter is not None:
        out["draft"] = engine.model_drafter.pool
    return out


def turn(engine, messages: list, i: int) -> int:
    """One user message and the reply; returns the reply's new tokens."""
    from engine.api.config import SamplingParams, SpecParams
    from engine.api.events import Summary

    messages.append({"role": "user", "content": PROMPTS[i % 3].format(TASKS[i % len(TASKS)])})
    ids = engine.encode_chat(messages)
    sampling = SamplingParams(temperature=0.0 if i % 2 else 0.8, max_new_tokens=16, seed=i)
    summary = next(ev for ev in engine.generate(ids, sampling, SpecParams(k=4, drafter="model"))
                   if isinstance(ev, Summary))
    messages.append({"role": "assistant", "content": summary.text})
    return summary.new_tokens


def main() -> int:
    from engine.service.loaders import default_loader

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("turns", type=int, nargs="?", default=300)
    ap.add_argument("per_chat", type=int, nargs="?", default=50, metavar="turns_per_chat")
    results.add_arguments(ap)
    a = ap.parse_args()
    turns, per_chat = a.turns, a.per_chat
    t0 = time.time()
    engine = default_loader(None, None, None, lambda stage, frac: None, lambda: False)
    kv = pools(engine)
    ranges = [(t.data_ptr(), t.data_ptr() + t.nbytes) for p in kv.values() for t in (p.k, p.v)]
    per_token = sum(p.k[:, 0].nbytes + p.v[:, 0].nbytes for p in kv.values())
    print(f"loaded in {time.time() - t0:.1f} s; KV {per_token / 1024:.1f} KiB per token (both models); "
          f"RSS {rss() / MB:.1f} MB, KV resident {resident(ranges) / MB:.1f} MB", flush=True)
    print("turn  RSS_MB  KV_resident_MB  rest_MB  positions(target,draft)  blocks_high_water(target,draft)  s")
    messages: list = []
    high = dict.fromkeys(kv, 0)
    samples = []  # the printed rows, for the record
    t0 = time.time()
    for i in range(1, turns + 1):
        if i % per_chat == 1 and i > 1:
            engine.reset()  # New chat
            messages = []
        turn(engine, messages, i)
        for name, p in kv.items():
            m = p.manager
            high[name] = max(high[name], m.num_blocks - m.num_free)
        if i % 10 == 0 or i == 1:
            r, k = rss(), resident(ranges)
            lengths = ",".join(str(p.manager.length(0)) for p in kv.values())
            print(f"{i:4d}  {r / MB:7.1f}  {k / MB:13.1f}  {(r - k) / MB:7.1f}  {lengths:>22}  "
                  f"{','.join(str(v) for v in high.values()):>30}  {time.time() - t0:5.0f}", flush=True)
            samples.append({"turn": i, "rss_mb": r / MB, "kv_resident_mb": k / MB, "rest_mb": (r - k) / MB,
                            "positions": [p.manager.length(0) for p in kv.values()],
                            "blocks_high_water": list(high.values()), "s": time.time() - t0})
    results.record(a, "scripts.bench.soak_rss", {"turns": turns, "turns_per_chat": per_chat,
                                                 "kv_kib_per_token": per_token / 1024, "samples": samples})
    return 0


if __name__ == "__main__":
    sys.exit(main())
