"""Integration on the real embedded pair (Qwen2.5-Coder 1.5B target, 0.5B draft), greedy, CPU."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from engine.api.config import STOP_BELOW, SamplingParams, SpecParams
from engine.io.loading import load_engine
from engine.io.provision import default_pair
from engine.spec.drafters import HybridDrafter

pytestmark = pytest.mark.embedded
PROMPTS = Path(__file__).resolve().parents[2] / "shared" / "bench" / "prompts.jsonl"
FALLBACK = [
    [{"role": "user", "content": "Write a Python function that returns the n-th Fibonacci number iteratively."}],
    [{"role": "user", "content": "Explain in three sentences what a hash map is."}],
    [{"role": "user", "content": "List three prime numbers as JSON."}],
]


@pytest.fixture(scope="module")
def engine():
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)  # real models: use every core
    target, draft = default_pair()
    yield load_engine(str(target), str(draft), device="cpu")
    torch.set_num_threads(threads)


def prompts() -> list[list[dict]]:
    if PROMPTS.is_file():
        return [json.loads(line)["messages"] for line in PROMPTS.read_text().splitlines()[:3]]
    return FALLBACK


@pytest.fixture(scope="module")
def plain_replies(engine):
    greedy = SamplingParams(temperature=0.0, max_new_tokens=48)
    out = []
    for messages in prompts():
        ids = engine.encode_chat(messages)
        engine.reset()
        *_, plain = engine.generate(ids, greedy, SpecParams(enabled=False))
        assert plain.new_tokens > 8 and plain.text.strip()
        out.append((ids, plain))
    return out


def test_the_pair_runs_quantized(engine):
    from engine.cpu import QuantLinear, kernels_available

    assert kernels_available(), "the C++ kernels did not build: the engine would run the slow fallback"
    for model in (engine.target, engine.draft):
        assert isinstance(model.layers[0].mlp.down, QuantLinear) and isinstance(model.lm_head, QuantLinear)
    for pool in (engine.target_pool, engine.model_drafter.pool):  # half the memory and bytes read of fp32
        assert pool.k.dtype == pool.v.dtype == torch.float16


@pytest.mark.parametrize("k", [1, 4, 8])
@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_greedy_speculative_matches_plain_on_real_pair(engine, plain_replies, drafter, k):
    greedy = SamplingParams(temperature=0.0, max_new_tokens=48)
    drafted = 0
    for ids, plain in plain_replies:
        engine.reset()
        *_, spec = engine.generate(ids, greedy, SpecParams(k=k, drafter=drafter))
        assert spec.token_ids == plain.token_ids, f"{drafter} K={k}: speculative output differs from plain"
        drafted += spec.drafted
    assert drafted > 0


def test_hybrid_drafter_matches_plain_on_real_pair(engine, plain_replies, monkeypatch):
    """The app's "draft model + n-gram" choice, with its bar at 0 so n-gram and model rounds alternate."""
    monkeypatch.setattr(HybridDrafter, "MIN_EXPECTED", 0.0)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=48)
    sources: set[str] = set()
    for ids, plain in plain_replies:
        engine.reset()
        events = list(engine.generate(ids, greedy, SpecParams(k=4, drafter="hybrid", stop_below=STOP_BELOW)))
        assert events[-1].token_ids == plain.token_ids, "hybrid: speculative output differs from plain"
        sources |= {ev.drafter for ev in events[:-1] if ev.drafted}
    assert sources == {"model", "ngram"}


def test_real_pair_writes_sensible_code(engine):
    ids = engine.encode_chat([{"role": "user", "content": "Write a Python function add(a, b) that returns a + b."}])
    engine.reset()
    *_, s = engine.generate(ids, SamplingParams(max_new_tokens=40), SpecParams(k=3))
    assert "def add" in s.text
    assert s.acceptance_rate > 0.3  # same-family 0.5B draft agrees with the 1.5B target most of the time
