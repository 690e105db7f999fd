"""Rejected drafts leave no trace: both caches roll back to the committed ids, and what the models see
afterwards is exactly what a fresh prefill would give, whatever the block layout."""
from __future__ import annotations

import pytest
import torch

from engine.api.config import SamplingParams, SpecParams
from engine.api.events import RoundEvent, Summary
from engine.model.kv_cache import BlockManager, KVPool
from engine.model.transformer import Transformer
from engine.runtime.engine import Engine
from tests.tiny import tiny_engine

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=40)
SAMPLED = SamplingParams(temperature=1.0, max_new_tokens=40, seed=7)
MESSAGES = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def engine() -> Engine:
    return tiny_engine()


def fresh_pool(model: Transformer, num_blocks: int = 64, block_size: int = 8) -> KVPool:
    cfg = model.cfg
    pool = KVPool(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, BlockManager(num_blocks, block_size, 512),
                  torch.float32, "cpu")
    pool.manager.allocate(0)
    return pool


def prefill_logits(model: Transformer, ids: list[int]) -> torch.Tensor:
    """Logits (T, V) for ids from an empty cache, in one pass."""
    pool = fresh_pool(model)
    start, end = pool.manager.append(0, len(ids))
    return model(torch.tensor(ids), start, pool.view(0, start, end))


def feed(model: Transformer, pool: KVPool, ids: list[int]) -> torch.Tensor:
    start, end = pool.manager.append(0, len(ids))
    return model(torch.tensor(ids), start, pool.view(0, start, end))


def assert_consistent(engine: Engine) -> None:
    m = engine.target_pool.manager
    assert m.length(0) == len(engine.ids) - 1
    d = engine.model_drafter
    assert engine.ids[: len(d.cached)] == d.cached  # the draft caches a prefix of the committed ids
    assert d.pool.manager.length(0) == len(d.cached)


@pytest.mark.parametrize("sampling", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_caches_truncated_to_committed_length_after_every_round(engine, sampling):
    prompt = engine.encode_chat(MESSAGES)
    engine.reset()
    rejected_rounds = 0
    for item in engine.generate(prompt, sampling, SpecParams(k=4)):
        if isinstance(item, Summary):
            break
        assert_consistent(engine)
        d = engine.model_drafter
        if item.accepted == len(item.drafted):  # all passed: the last draft was never fed to the draft
            assert len(d.cached) == len(engine.ids) - 2
        else:  # a rejection: the draft keeps exactly the committed ids but the last
            assert len(d.cached) == len(engine.ids) - 1
        assert engine.target_pool.manager.contiguous_base(0) == 0  # LIFO reuse: one slice throughout
        if item.accepted < len(item.drafted):
            rejected_rounds += 1
            # Only the accepted drafts plus the correction were committed.
            assert len(item.committed) == item.accepted + 1
            assert item.committed[-1].token_id != item.drafted[item.accepted].token_id
    assert rejected_rounds >= 3
    assert_consistent(engine)


def test_logits_after_rollback_match_fresh_prefill(engine):
    """After a rejection the slot of the first rejected draft holds stale KV; re-feeding overwrites it."""
    prompt = engine.encode_chat(MESSAGES)
    engine.reset()
    checked = 0
    gen = engine.generate(prompt, GREEDY, SpecParams(k=4))
    for item in gen:
        if isinstance(item, Summary) or checked == 3:
            break
        if not (item.drafted and item.accepted < len(item.drafted)):
            continue
        ids = list(engine.ids)
        # Target: the cache holds ids[:-1]; feeding the last id gives the next-token logits.
        tp = engine.target_pool
        n = tp.manager.length(0)
        got = feed(engine.target, tp, ids[n:])[-1]
        want = prefill_logits(engine.target, ids)[-1]
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        assert got.argmax() == want.argmax()
        # Every cached position's stored K/V matches a fresh prefill's.
        ref = fresh_pool(engine.target)
        feed(engine.target, ref, ids)
        slots = torch.tensor(tp.manager.slots(0, 0, len(ids)))
        ref_slots = torch.tensor(ref.manager.slots(0, 0, len(ids)))
        torch.testing.assert_close(tp.k[:, :, slots], ref.k[:, :, ref_slots], atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(tp.v[:, :, slots], ref.v[:, :, ref_slots], atol=1e-4, rtol=1e-4)
        tp.manager.truncate_to(0, n)  # put the engine back as it was
        # Draft: same check on its own cache.
        d = engine.model_drafter
        dn = d.pool.manager.length(0)
        got = feed(engine.draft, d.pool, ids[dn:])[-1]
        want = prefill_logits(engine.draft, ids)[-1]
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
        d.pool.manager.truncate_to(0, dn)
        checked += 1
    gen.close()
    assert checked == 3


def test_generation_continues_correctly_after_rollbacks(engine):
    """Many rollbacks in: the speculative reply is still token-identical to plain greedy."""
    prompt = engine.encode_chat(MESSAGES)
    engine.reset()
    *_, spec = engine.generate(prompt, GREEDY, SpecParams(k=6))
    engine.reset()
    *_, plain = engine.generate(prompt, GREEDY, SpecParams(enabled=False))
    assert spec.accepted < spec.drafted  # there were rejections to roll back
    assert spec.token_ids == plain.token_ids


# --- scattered block tables -------------------------------------------------------------------------


def scatter(m: BlockManager, rounds: int) -> None:
    """Shuffle the free list through the public API so that sequence 0's next blocks are out of order
    (neither consecutive nor increasing), with a live neighbour (sequence 3) in between."""
    bs = m.block_size
    m.allocate(1)
    m.allocate(2)
    for _ in range(rounds):
        m.append(1, bs)  # even blocks
        m.append(2, bs)  # odd blocks
    m.free(2)
    m.free(1)  # free list now hands out the even blocks, then the odd ones
    m.allocate(3)
    m.append(3, 2 * bs)  # blocks 0 and 2


def scattered_pool(model: Transformer, block_size: int = 4) -> KVPool:
    pool = fresh_pool(model, num_blocks=64, block_size=block_size)
    scatter(pool.manager, 12)
    # Garbage everywhere, so that reading a wrong slot cannot go unnoticed.
    pool.k.fill_(100.0)
    pool.v.fill_(-100.0)
    return pool


def test_scattered_tables_give_the_same_logits_as_contiguous(engine):
    model = engine.target
    ids = torch.randint(3, 98, (70,), generator=torch.Generator().manual_seed(0)).tolist()
    contig = fresh_pool(model, block_size=4)
    scat = scattered_pool(model, block_size=4)
    offset = fresh_pool(model, block_size=4)  # one slice, but not at the start of the pool
    offset.manager.allocate(3)
    offset.manager.append(3, 12)
    offset.k.fill_(100.0)
    offset.v.fill_(-100.0)

    def step(tokens: list[int]) -> None:
        a = feed(model, contig, tokens)
        b = feed(model, scat, tokens)
        c = feed(model, offset, tokens)
        torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(c, a, atol=1e-5, rtol=1e-5)
        assert offset.manager.contiguous_base(0) == 3 * 4

    step(ids[:23])  # a multi-token prefill across several blocks
    assert scat.manager.contiguous_base(0) is None
    assert contig.manager.contiguous_base(0) == 0
    for t in range(23, 30):  # single-token decodes
        step(ids[t : t + 1])
    step(ids[30:36])  # a verify-sized chunk
    for pool in (contig, scat, offset):  # roll back into the middle of a block, then take a different path
        pool.manager.truncate_to(0, 27)
    step(ids[40:45])
    step(ids[45:46])
    step(ids[50:70])  # grow past the even blocks into the odd ones
    table = scat.manager.block_table(0)
    assert table != sorted(table) and scat.manager.contiguous_base(0) is None  # really out of order
    assert scat.manager.length(3) == 8 and not set(table) & set(scat.manager.block_table(3))
    # And both agree with a fresh prefill of the path actually taken (stale KV from ids[27:36] is gone).
    path = ids[:27] + ids[40:46] + ids[50:70]
    want = prefill_logits(model, path + ids[:1])[-1]
    torch.testing.assert_close(feed(model, scat, ids[:1])[-1], want, atol=1e-4, rtol=1e-4)


def test_engine_with_scattered_tables_matches_contiguous():
    results = []
    for scattered in (False, True):
        eng = tiny_engine()
        prompt = eng.encode_chat(MESSAGES)
        if scattered:
            for pool in (eng.target_pool, eng.model_drafter.pool):
                scatter(pool.manager, 6)
                pool.k.fill_(100.0)
                pool.v.fill_(-100.0)
        layouts = []
        out = []
        for item in eng.generate(prompt, GREEDY, SpecParams(k=4)):
            out.append(item)
            if isinstance(item, RoundEvent):
                layouts.append(eng.target_pool.manager.contiguous_base(0))
                assert_consistent(eng)
        summary = out[-1]
        if scattered:
            assert all(b is None for b in layouts)
            table = eng.target_pool.manager.block_table(0)
            assert table != sorted(table)
            assert eng.model_drafter.pool.manager.contiguous_base(0) is None
            assert eng.target_pool.manager.block_table(3) == [0, 2]  # the neighbour is untouched
        else:
            assert all(b == 0 for b in layouts)
        results.append((summary.token_ids, [(len(e.drafted), e.accepted) for e in out[:-1]]))
    assert results[0] == results[1]  # same tokens, same round-by-round acceptance
