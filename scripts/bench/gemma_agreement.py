"""How far greedy text agrees between SpecLens and llama.cpp on Gemma 3 270M, and between llama.cpp's own settings.

    python -m scripts.bench.gemma_agreement [--tokens 32]

Our plain greedy continuation of each prompt (the C++ CPU stack, 2 threads) beside llama-server's on the same GGUF in
several of its own settings: its default (flash attention chosen automatically, the prompt read in one batch), flash
attention off, and the prompt read one token per micro-batch (`-ub 1`, the order a one-token step sums in). For each
pair of runs it prints, prompt by prompt, how many leading tokens the two continuations share (N of N: the same
text). llama.cpp's settings change the rounding (its flash attention keeps f16 operands, a batch sums in another
order), so where two candidates are near-tied its own runs part as well: the table says whether SpecLens parts from
llama.cpp more often than llama.cpp parts from itself. It writes a results record like every benchmark.

Needs the Gemma 3 270M packages (speclens[test]) and ../shared/bench/llama_cpp_build.sh.
"""
from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
from pathlib import Path

import httpx
import torch

from engine.api.config import CacheConfig, SamplingParams, SpecParams
from engine.io.loading import load_engine
from engine.io.provision import GEMMA3_270M, ProvisionError, provision
from engine.tools import results
from tests.llama_server import llama_server

SHARED = Path(__file__).resolve().parents[3] / "shared" / "bench"
PROMPTS = ("The capital of France is", "def fibonacci(n):\n", "Once upon a time, in a small village,",
           "The three primary colors are", "import numpy as np\n", "Water boils at", "My favourite book is")
# llama-server's settings, each a run of its own: (name, its arguments)
SETTINGS = (("llama.cpp default", ()), ("llama.cpp -fa off", ("-fa", "off")), ("llama.cpp -ub 1", ("-ub", "1")),
            ("llama.cpp -ub 1 -fa off", ("-ub", "1", "-fa", "off")))
OURS = "SpecLens"


def shared_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens a and b share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def ours(gguf: Path, tokens: int) -> tuple[dict[str, list[int]], object]:
    torch.set_num_threads(2)
    engine = load_engine(str(gguf), None, device="cpu", cache=CacheConfig(max_seq_len=256))
    out = {}
    for text in PROMPTS:
        engine.reset()
        *_, done = engine.generate(engine.tokenizer.encode(text), SamplingParams(max_new_tokens=tokens),
                                   SpecParams(enabled=False))
        out[text] = list(done.token_ids)
    return out, engine.tokenizer


def theirs(binary: Path, gguf: Path, args: tuple[str, ...], tokenizer, tokens: int) -> dict[str, list[int]]:
    out = {}
    with llama_server(binary, gguf, "-t", "2", "-c", "512", *args) as url:
        for text in PROMPTS:
            r = httpx.post(f"{url}/completion", json={"prompt": tokenizer.encode(text), "n_predict": tokens,
                                                      "temperature": 0, "cache_prompt": False,
                                                      "return_tokens": True}, timeout=300)
            r.raise_for_status()
            out[text] = list(r.json()["tokens"])
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=32, help="greedy tokens per prompt (1..200)")
    results.add_arguments(ap)
    a = ap.parse_args(argv)
    if not 1 <= a.tokens <= 200:
        raise SystemExit(f"gemma_agreement: --tokens must be in 1..200, got {a.tokens}")
    try:
        gguf = provision(GEMMA3_270M)
    except ProvisionError as e:
        raise SystemExit(f"gemma_agreement: Gemma 3 270M is not available: {e}") from e
    build = subprocess.run(["bash", str(SHARED / "llama_cpp_build.sh")], env=os.environ | {"PYTHON": sys.executable},
                           text=True, capture_output=True, timeout=1800, check=False)
    if build.returncode != 0:
        raise SystemExit(f"gemma_agreement: llama.cpp did not build: {build.stderr.strip()[-300:]}")
    binary = Path(build.stdout.strip()) / "llama-server"
    runs: dict[str, dict[str, list[int]]] = {}
    runs[OURS], tokenizer = ours(gguf, a.tokens)
    for name, args in SETTINGS:
        runs[name] = theirs(binary, gguf, args, tokenizer, a.tokens)
    pairs = {}
    print(f"leading greedy tokens shared, of {a.tokens}, prompt by prompt ({len(PROMPTS)} prompts); "
          "'same text': prompts where all are shared")
    for x, y in itertools.combinations(runs, 2):
        shared = [shared_prefix(runs[x][t], runs[y][t]) for t in PROMPTS]
        same = sum(s == a.tokens for s in shared)
        pairs[f"{x} | {y}"] = {"shared": shared, "same_text": same}
        print(f"{x:>24} vs {y:<24} {'/'.join(map(str, shared)):<26} same text {same} of {len(PROMPTS)}")
    results.record(a, "scripts.bench.gemma_agreement",
                   {"model": gguf.name, "tokens": a.tokens, "prompts": list(PROMPTS), "pairs": pairs,
                    "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
