"""Deterministic checks on the accept rule and the draft's q, beside the chi-square tests of tests/engine/test_exactness.py.

A chi-square test at 20,000 draws cannot see a small bias (accepting when u*q < 1.03 p), nor a q that differs from
what the draft sampled from only where the test's prompt puts little mass. These replay each round's own numbers
instead: the uniform draws that tested the drafts, and the draft's logits at every drafted position.
"""
from __future__ import annotations

import pytest
import torch

from engine.api.config import CacheConfig, SamplingParams, SpecParams
from engine.model.kv_cache import BlockManager, KVPool
from engine.model.transformer import Transformer
from engine.runtime.engine import Engine
from engine.spec.accept import accept_reject
from engine.spec.sampling import probs_from_logits
from tests.engine.test_exactness import assert_exact_distribution, small_pair


def first_failure(u: list[float], q: list[float], p: list[float]) -> int:
    """The first index whose draft fails u*q < p, computed in float32 as the rule computes it; len(u) if none."""
    passed = (torch.tensor(u) * torch.tensor(q) < torch.tensor(p)).tolist()
    return passed.index(False) if False in passed else len(passed)


def test_accepted_count_is_the_first_failed_test_of_each_round():
    """Over many seeds and rounds of the real engine, the accepted count is exactly the first i with u_i*q_i >= p_i,
    read from the round's own record (the inspector's u, the drafted tokens' p and q)."""
    target, draft, tok = small_pair()
    engine = Engine(target, tok, draft, cache=CacheConfig(block_size=8, max_seq_len=256), eos_ids=set())
    prompt = engine.encode_chat([{"role": "user", "content": "abcabc"}])
    params = SamplingParams(temperature=1.0, max_new_tokens=12)
    rounds = near_misses = 0
    for seed in range(300):
        *events, _ = engine.generate(prompt, params.with_(seed=seed), SpecParams(k=4))
        for ev in (e for e in events if e.drafted):
            u = [pos.u for pos in ev.positions[: len(ev.drafted)]]
            q, p = [d.q for d in ev.drafted], [d.p for d in ev.drafted]
            accepted = sum(d.accepted for d in ev.drafted)
            assert accepted == first_failure(u, q, p), (seed, ev.round, u, q, p)
            assert [d.accepted for d in ev.drafted] == [i < accepted for i in range(len(ev.drafted))]
            rounds += 1
            near_misses += sum(pi <= ui * qi < 1.05 * pi for ui, qi, pi in zip(u, q, p))
    assert rounds > 500
    assert near_misses >= 10  # draws that a rule biased by a few percent would have accepted


def test_accept_rule_replays_its_uniform_draws():
    """accept_reject on p/q ratios just below 1: the draws it makes, replayed from a copy of the generator,
    decide the count exactly (a 3% bias in the comparison flips about one test in a hundred here)."""
    vocab, k = 16, 4
    drafted = torch.tensor([3, 5, 7, 9])
    q = torch.full((k, vocab), 0.5 / (vocab - 1))
    q[torch.arange(k), drafted] = 0.5
    q = q / q.sum(-1, keepdim=True)  # (K, V)
    p = torch.full((k + 1, vocab), 1.0 / vocab)
    p[torch.arange(k), drafted] = 0.99 * q[torch.arange(k), drafted]
    p = p / p.sum(-1, keepdim=True)  # (K+1, V): p(t)/q(t) a little under 1 at every drafted token
    flips = 0
    for seed in range(3000):
        gen = torch.Generator().manual_seed(seed)
        replay = torch.Generator().manual_seed(seed)
        v = accept_reject(drafted, q, p, gen)
        u = torch.rand(k, generator=replay)  # the rule's first draws: one per drafted token
        rows = torch.arange(k)
        assert v.accepted == first_failure(u.tolist(), q[rows, drafted].tolist(), p[rows, drafted].tolist())
        assert list(v.u) == u.tolist()
        pt, qt = p[rows, drafted], q[rows, drafted]
        flips += int(((u * qt >= pt) & (u * qt < 1.03 * pt)).any())
    assert flips >= 30


def draft_logits(model: Transformer, ids: list[int]) -> torch.Tensor:
    """The draft's logits after ids, from a fresh cache. (V,)"""
    pool = KVPool(model.cfg.num_layers, model.cfg.num_kv_heads, model.cfg.head_dim, BlockManager(32, 8, 256),
                  torch.float32, "cpu")
    pool.manager.allocate(0)
    start, end = pool.manager.append(0, len(ids))
    return model(torch.tensor(ids), start, pool.view(0, start, end), last_only=True)[0]


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.3, top_k=4),
    SamplingParams(temperature=1.0, top_k=3, top_p=0.9),
    SamplingParams(temperature=0.8, top_p=0.7, repetition_penalty=1.4),
    SamplingParams(temperature=1.5, top_k=5, repetition_penalty=1.2),
    SamplingParams(temperature=0.0),
    SamplingParams(temperature=0.0, repetition_penalty=5.0),
], ids=["T1.3-topk4", "topk3-topp", "topp-penalty", "T1.5-topk5-penalty", "greedy", "greedy-penalty"])
def test_each_proposed_q_row_is_the_transform_of_the_draft_logits(params):
    """Every q row the model drafter hands on is the sampling transform of its logits at that position (zero
    outside top-k, renormalised after top-p, penalised for the tokens drafted before it; under greedy the point
    mass at the penalised argmax, which the drafter makes without the transform), and each drafted token lies in
    its row's support."""
    target, draft, tok = small_pair()
    engine = Engine(target, tok, draft, cache=CacheConfig(block_size=8, max_seq_len=256), eos_ids=set())
    prompt = engine.encode_chat([{"role": "user", "content": "hello there"}])
    drafter = engine.model_drafter
    drafter.configure(SpecParams(k=5, stop_below=0.0))
    for seed in range(5):
        drafter.reset()
        proposal = drafter.propose(prompt, 5, params, torch.Generator().manual_seed(seed))
        tokens = proposal.tokens.tolist()
        assert len(tokens) == 5
        for i, t in enumerate(tokens):
            ctx = prompt + tokens[:i]
            want = probs_from_logits(draft_logits(draft, ctx), params, torch.tensor(ctx))  # (V,)
            got = proposal.q[i]
            assert torch.equal(got > 0, want > 0), f"row {i}: the support differs from the transform's"
            torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
            assert got[t] > 0


def test_sampling_distribution_is_exact_with_a_small_top_k_through_the_accept_path():
    """Top-k of 4 at T = 1.5, K = 2: both scored tokens go through accept/reject or the correction, where a q
    computed without top-k would raise acceptance and bend the residual."""
    assert_exact_distribution(*small_pair(), "model", 1.5, 1.0, top_k=4)
