"""Prefix reuse across chat turns: the cached KV of the shared prefix is kept, and the result is exactly
what a fresh engine computes from scratch."""
from __future__ import annotations

import time

import pytest
import torch

from engine.api.config import SamplingParams, SpecParams
from engine.api.events import Summary
from engine.model.forward import common_prefix
from engine.model.kv_cache import BlockManager, KVPool
from engine.model.transformer import Transformer
from engine.runtime.engine import Engine
from tests.tiny import tiny_engine

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=16)
SPEC = SpecParams(k=4)
TURN1 = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def engine() -> Engine:
    return tiny_engine()


@pytest.fixture(scope="module")
def fresh() -> Engine:
    """A second engine on the same weights, reset before every use so nothing is reused."""
    return tiny_engine()


def run(engine: Engine, prompt: list[int], sampling=GREEDY, spec=SPEC) -> Summary:
    *_, summary = engine.generate(prompt, sampling, spec)
    assert isinstance(summary, Summary)
    return summary


def from_scratch(fresh: Engine, prompt: list[int], sampling=GREEDY) -> Summary:
    fresh.reset()
    s = run(fresh, prompt, sampling, SpecParams(enabled=False))
    assert s.reused_prefix_tokens == 0
    return s


def expected_reuse(engine: Engine, prompt: list[int]) -> int:
    cached = engine.ids[: engine.target_pool.manager.length(0)]
    return min(common_prefix(cached, prompt), len(prompt) - 1)


def prefill(model: Transformer, ids: list[int]) -> tuple[KVPool, torch.Tensor]:
    cfg = model.cfg
    pool = KVPool(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, BlockManager(64, 8, 512), torch.float32, "cpu")
    pool.manager.allocate(0)
    start, end = pool.manager.append(0, len(ids))
    return pool, model(torch.tensor(ids), start, pool.view(0, start, end))


def assert_cache_matches_fresh(model: Transformer, pool: KVPool, ids: list[int]) -> None:
    """The first len(ids) cached positions hold what a fresh prefill of ids stores."""
    ref, _ = prefill(model, ids)
    got_slots = torch.tensor(pool.manager.slots(0, 0, len(ids)))
    ref_slots = torch.tensor(ref.manager.slots(0, 0, len(ids)))
    torch.testing.assert_close(pool.k[:, :, got_slots], ref.k[:, :, ref_slots], atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(pool.v[:, :, got_slots], ref.v[:, :, ref_slots], atol=1e-4, rtol=1e-4)


def test_second_chat_turn_reuses_the_first(engine, fresh):
    engine.reset()
    p1 = engine.encode_chat(TURN1)
    s1 = run(engine, p1)
    assert s1.reused_prefix_tokens == 0
    history = list(engine.ids)
    assert history == p1 + list(s1.token_ids)
    turn2 = TURN1 + [{"role": "assistant", "content": s1.text}, {"role": "user", "content": "and then?"}]
    p2 = engine.encode_chat(turn2)
    want = expected_reuse(engine, p2)
    assert want >= len(p1)  # at least the whole first prompt is shared
    s2 = run(engine, p2)
    assert s2.reused_prefix_tokens == want > 0
    assert s2.prompt_tokens == len(p2)
    assert s2.target_forwards == s2.rounds + 1  # one prefill pass for the unshared part
    ref = from_scratch(fresh, p2)
    assert s2.token_ids == ref.token_ids
    assert s2.text == ref.text


@pytest.mark.parametrize("case", ["diverge_mid_block", "strict_prefix", "same_prompt", "nothing_shared"])
def test_reused_length_is_the_common_prefix_capped(engine, fresh, case):
    engine.reset()
    p1 = engine.encode_chat(TURN1)
    s1 = run(engine, p1)
    history = list(engine.ids)  # p1 + reply; the cache holds all but the last
    if case == "diverge_mid_block":
        cut = 13  # not a multiple of the block size (8)
        new = [t for t in engine.tokenizer.encode("xyz?!") if t != history[cut]]
        prompt, want = history[:cut] + new, cut
    elif case == "strict_prefix":
        prompt = history[:20]
        want = 19  # capped at len(prompt) - 1: the last prompt token is fed by the first round
    elif case == "same_prompt":
        prompt, want = p1, len(p1) - 1
    else:
        prompt = [history[0] + 1] + history[1:]
        want = 0
    assert expected_reuse(engine, prompt) == want
    s = run(engine, prompt)
    assert s.reused_prefix_tokens == want
    assert s.target_forwards == s.rounds + (1 if len(prompt) - 1 > want else 0)
    assert s.token_ids == from_scratch(fresh, prompt).token_ids
    if case == "same_prompt":
        assert s.token_ids == s1.token_ids


def test_reuse_is_capped_by_what_the_cache_holds(engine):
    """The last committed token has no KV yet, so a follow-up containing it reuses one token less."""
    engine.reset()
    p1 = engine.encode_chat(TURN1)
    run(engine, p1)
    history = list(engine.ids)
    prompt = history + engine.tokenizer.encode("ok")
    s = run(engine, prompt, GREEDY.with_(max_new_tokens=2))
    assert common_prefix(history, prompt) == len(history)
    assert s.reused_prefix_tokens == len(history) - 1


def test_after_reset_nothing_is_reused(engine):
    p1 = engine.encode_chat(TURN1)
    run(engine, p1)
    engine.reset()
    assert engine.ids == [] and engine.target_pool.manager.length(0) == 0
    assert run(engine, p1).reused_prefix_tokens == 0


def test_target_and_draft_state_after_reuse_equal_a_fresh_prefill(engine):
    engine.reset()
    p1 = engine.encode_chat(TURN1)
    s1 = run(engine, p1, GREEDY.with_(max_new_tokens=24))
    # Diverge mid-way through the reply so stale KV sits past the reuse point.
    history = list(engine.ids)
    cut = len(p1) + 5
    prompt = history[:cut] + [t for t in engine.tokenizer.encode("QQ") if t != history[cut]] + history[cut + 1 : cut + 3]
    assert expected_reuse(engine, prompt) == cut
    s2 = run(engine, prompt, GREEDY.with_(max_new_tokens=1))  # a single plain step: cache then holds `prompt`
    assert s2.reused_prefix_tokens == cut
    ids = list(engine.ids)
    assert ids == prompt + list(s2.token_ids)
    tp = engine.target_pool
    assert tp.manager.length(0) == len(ids) - 1
    assert_cache_matches_fresh(engine.target, tp, ids[:-1])
    # Next-token logits through the reused cache equal a fresh prefill's.
    start, end = tp.manager.append(0, 1)
    got = engine.target(torch.tensor(ids[-1:]), start, tp.view(0, start, end))[-1]
    _, ref = prefill(engine.target, ids)
    torch.testing.assert_close(got, ref[-1], atol=1e-4, rtol=1e-4)
    tp.manager.truncate_to(0, len(ids) - 1)
    # A speculative follow-up brings the draft cache to the new history too.
    s3 = run(engine, ids + engine.tokenizer.encode("go"), GREEDY.with_(max_new_tokens=6))
    assert s3.reused_prefix_tokens == len(ids) - 1
    d = engine.model_drafter
    assert engine.ids[: len(d.cached)] == d.cached and len(d.cached) >= len(ids)
    assert_cache_matches_fresh(engine.draft, d.pool, d.cached)
    assert_cache_matches_fresh(engine.target, tp, engine.ids[:-1])


class SlowPrefill:
    """Wraps a Transformer so that multi-token passes (prefill; no verify passes in plain mode) take 0.4 s."""

    def __init__(self, model: Transformer) -> None:
        self.model, self.cfg = model, model.cfg

    def __call__(self, ids, start, cache, **kw):
        if len(ids) > 1:
            time.sleep(0.4)
        return self.model(ids, start, cache, **kw)


def test_tokens_per_s_is_the_decode_rate_whatever_the_prefill_cost():
    """Summary.tokens_per_s is documented as "new tokens / time from first token to last". A first turn
    that pays for a prefill and a repeat that reuses it decode equally fast, so their rates must be close;
    the compare view divides one by the other to report a speedup."""
    eng = tiny_engine(draft=False)
    eng.target = SlowPrefill(eng.target)
    prompt = eng.encode_chat(TURN1)
    sampling = GREEDY.with_(max_new_tokens=8)
    cold = run(eng, prompt, sampling, SpecParams(enabled=False))
    warm = run(eng, prompt, sampling, SpecParams(enabled=False))
    assert cold.reused_prefix_tokens == 0 and warm.reused_prefix_tokens == len(prompt) - 1
    assert cold.ttft_s > 0.4 > warm.ttft_s
    assert cold.token_ids == warm.token_ids
    # A decode rate excludes the time to the first token.
    assert cold.tokens_per_s > 3 * cold.new_tokens / cold.total_s
    # And so the first (cold) and second (warm) run of a comparison are on the same footing.
    assert cold.tokens_per_s > warm.tokens_per_s / 10


def test_common_prefix_is_the_walk_id_by_id():
    """The slice-compare version against the plain definition: a parting before, inside and after a compared
    block, at a block's edge, in lists of different lengths, and none."""
    import random

    def walk(a, b):
        i = 0
        while i < min(len(a), len(b)) and a[i] == b[i]:
            i += 1
        return i

    rng = random.Random(0)
    cases = [([], []), ([1], []), ([1, 2], [1, 2]), ([1, 2], [1, 3])]
    for n in (1, 63, 64, 65, 128, 200, 1500):
        base = [rng.randrange(1000) for _ in range(n)]
        cases.append((base, base + [7, 8]))
        for at in {0, n // 2, n - 1, 63, 64, 65, 127, 128} - {x for x in (63, 64, 65, 127, 128) if x >= n}:
            other = list(base)
            other[at] = other[at] + 1
            cases += [(base, other), (other + [1], base), (base, other[: at + 1] + [5] * 70)]
    for a, b in cases:
        assert common_prefix(a, b) == walk(a, b) == common_prefix(b, a), (len(a), len(b))
