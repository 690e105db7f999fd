"""BlockManager bookkeeping on its own: pure Python, no tensors involved."""
from __future__ import annotations

import random

import pytest

from engine.model.kv_cache import BlockManager, CacheFullError


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def snapshot(m: BlockManager) -> tuple:
    """Everything observable about the manager's state."""
    seqs = sorted(m._tables)
    return (
        m.num_free,
        tuple((s, m.length(s), tuple(m.block_table(s))) for s in seqs),
        tuple(m._free),
    )


def check_invariants(m: BlockManager) -> None:
    held = [b for s in m._tables for b in m.block_table(s)]
    assert len(held) == len(set(held)), "a block is owned twice"
    assert not set(held) & set(m._free), "a block is both owned and free"
    assert len(m._free) == len(set(m._free)), "a block is free twice"
    assert len(held) + m.num_free == m.num_blocks
    assert set(held) | set(m._free) == set(range(m.num_blocks))
    for s in m._tables:
        assert len(m.block_table(s)) == ceil_div(m.length(s), m.block_size)
        assert 0 <= m.length(s) <= m.max_seq_len


# --- single sequence --------------------------------------------------------------------------------


def test_allocate_append_returns_positions_and_takes_blocks():
    m = BlockManager(num_blocks=8, block_size=4, max_seq_len=32)
    m.allocate(0)
    assert m.length(0) == 0 and m.block_table(0) == [] and m.num_free == 8
    assert m.append(0, 3) == (0, 3)
    assert m.block_table(0) == [0] and m.num_free == 7
    assert m.append(0, 1) == (3, 4)  # fills block 0 exactly: no new block
    assert m.block_table(0) == [0] and m.num_free == 7
    assert m.append(0, 1) == (4, 5)  # spills into a second block
    assert m.block_table(0) == [0, 1] and m.num_free == 6
    assert m.append(0, 0) == (5, 5)  # appending nothing is a no-op
    assert m.block_table(0) == [0, 1] and m.length(0) == 5
    assert m.append(0, 9) == (5, 14)
    assert m.block_table(0) == [0, 1, 2, 3] and m.length(0) == 14 and m.num_free == 4
    check_invariants(m)


def test_allocate_twice_raises():
    m = BlockManager(4, 4, 16)
    m.allocate(3)
    with pytest.raises(ValueError, match="already exists"):
        m.allocate(3)


def test_block_table_is_a_copy():
    m = BlockManager(4, 4, 16)
    m.allocate(0)
    m.append(0, 5)
    t = m.block_table(0)
    t.append(99)
    assert m.block_table(0) == [0, 1]


def test_blocks_needed():
    m = BlockManager(8, 4, 32)
    m.allocate(0)
    assert m.blocks_needed(0, 0) == 0
    assert m.blocks_needed(0, 1) == 1
    assert m.blocks_needed(0, 4) == 1
    assert m.blocks_needed(0, 5) == 2
    m.append(0, 3)
    assert m.blocks_needed(0, 1) == 0
    assert m.blocks_needed(0, 2) == 1
    assert m.blocks_needed(0, 9) == 2  # 12 tokens: 3 blocks, 1 held
    assert m.blocks_needed(0, 10) == 3


def test_truncate_returns_blocks_wholly_past_n_and_keeps_partial_last_block():
    m = BlockManager(8, 4, 32)
    m.allocate(0)
    m.append(0, 14)  # blocks [0, 1, 2, 3], the last one half full
    m.truncate_to(0, 9)  # positions 8 (block 2) survives: block 2 is kept partially, block 3 goes back
    assert m.length(0) == 9
    assert m.block_table(0) == [0, 1, 2]
    assert m.num_free == 5
    m.truncate_to(0, 8)  # exactly two full blocks: block 2 is now wholly past n
    assert m.block_table(0) == [0, 1] and m.num_free == 6
    m.truncate_to(0, 8)  # truncating to the current length changes nothing
    assert m.block_table(0) == [0, 1] and m.length(0) == 8 and m.num_free == 6
    m.truncate_to(0, 1)
    assert m.block_table(0) == [0] and m.length(0) == 1
    m.truncate_to(0, 0)
    assert m.block_table(0) == [] and m.length(0) == 0 and m.num_free == 8
    check_invariants(m)


def test_free_returns_everything_and_forgets_the_sequence():
    m = BlockManager(8, 4, 32)
    m.allocate(0)
    m.allocate(1)
    m.append(0, 10)
    m.append(1, 5)
    assert m.num_free == 3
    m.free(0)
    assert m.num_free == 6
    with pytest.raises(KeyError):
        m.length(0)
    m.allocate(0)  # the id can be reused after free
    assert m.length(0) == 0
    check_invariants(m)


def test_lifo_reuse_keeps_a_rolled_back_table_contiguous():
    m = BlockManager(16, 4, 64)
    m.allocate(0)
    m.append(0, 20)  # blocks 0..4
    assert m.block_table(0) == [0, 1, 2, 3, 4]
    assert m.contiguous_base(0) == 0
    for _ in range(10):  # speculative rounds: grow by K+1, roll back to a bit more than before
        m.append(0, 9)
        m.truncate_to(0, m.length(0) - 6)
        table = m.block_table(0)
        assert table == list(range(len(table)))  # the same low blocks, in order
        assert m.contiguous_base(0) == 0
    check_invariants(m)


def test_contiguous_base_for_a_table_that_does_not_start_at_zero():
    m = BlockManager(8, 4, 32)
    m.allocate(0)
    m.allocate(1)
    m.append(0, 8)  # blocks 0, 1
    m.append(1, 8)  # blocks 2, 3
    assert m.contiguous_base(1) == 2 * 4
    assert m.slots(1, 0, 8) == list(range(8, 16))
    m.allocate(2)
    assert m.contiguous_base(2) == 0  # empty table: trivially one slice


def test_slots_mapping():
    m = BlockManager(8, 4, 32)
    m.allocate(0)
    m.allocate(1)
    m.append(0, 4)  # block 0
    m.append(1, 4)  # block 1
    m.append(0, 4)  # block 2
    m.append(1, 2)  # block 3
    m.append(0, 2)  # block 4
    assert m.block_table(0) == [0, 2, 4]
    assert m.slots(0, 0, 10) == [0, 1, 2, 3, 8, 9, 10, 11, 16, 17]
    assert m.slots(0, 3, 6) == [3, 8, 9]
    assert m.slots(1, 0, 6) == [4, 5, 6, 7, 12, 13]
    assert m.slots(0, 5, 5) == []
    # Every slot of every live position is distinct across sequences.
    all_slots = m.slots(0, 0, m.length(0)) + m.slots(1, 0, m.length(1))
    assert len(all_slots) == len(set(all_slots))


# --- failures leave no trace ------------------------------------------------------------------------


def test_out_of_blocks_raises_before_any_state_change():
    m = BlockManager(num_blocks=4, block_size=4, max_seq_len=1000)
    m.allocate(0)
    m.allocate(1)
    m.append(0, 6)  # blocks 0, 1
    m.append(1, 3)  # block 2
    before = snapshot(m)
    with pytest.raises(CacheFullError, match="out of blocks"):
        m.append(0, 7)  # needs 2 more blocks (13 tokens -> 4 blocks), only 1 free
    assert snapshot(m) == before
    with pytest.raises(CacheFullError):
        m.append(1, 6)  # 9 tokens -> 3 blocks, has 1, only 1 free
    assert snapshot(m) == before
    # What still fits does fit, and the boundary is exact.
    assert m.append(0, 2) == (6, 8)  # fills block 1, no new block
    assert m.append(1, 5) == (3, 8)  # takes the last block
    assert m.num_free == 0
    before = snapshot(m)
    with pytest.raises(CacheFullError):
        m.append(0, 1)
    assert snapshot(m) == before
    assert issubclass(CacheFullError, RuntimeError)
    check_invariants(m)


def test_past_max_seq_len_raises_before_any_state_change():
    m = BlockManager(num_blocks=100, block_size=4, max_seq_len=10)
    m.allocate(0)
    m.append(0, 7)
    before = snapshot(m)
    with pytest.raises(CacheFullError, match="10"):
        m.append(0, 4)
    assert snapshot(m) == before
    assert m.append(0, 3) == (7, 10)  # exactly max_seq_len is allowed
    with pytest.raises(CacheFullError):
        m.append(0, 1)
    assert m.length(0) == 10
    check_invariants(m)


@pytest.mark.parametrize("n", [-1, 6, 100])
def test_bad_truncate_raises_value_error_without_state_change(n):
    m = BlockManager(8, 4, 32)
    m.allocate(0)
    m.append(0, 5)
    before = snapshot(m)
    with pytest.raises(ValueError, match="truncate"):
        m.truncate_to(0, n)
    assert snapshot(m) == before


def test_negative_append_raises():
    m = BlockManager(8, 4, 32)
    m.allocate(0)
    m.append(0, 5)
    before = snapshot(m)
    with pytest.raises(ValueError):
        m.append(0, -1)
    assert snapshot(m) == before


@pytest.mark.parametrize("args", [(0, 4, 8), (4, 0, 8), (4, 4, 0)])
def test_bad_construction(args):
    with pytest.raises(ValueError):
        BlockManager(*args)


# --- several sequences ------------------------------------------------------------------------------


def test_interleaved_sequences_scatter_their_tables():
    m = BlockManager(12, 2, 64)
    m.allocate(0)
    m.allocate(1)
    for _ in range(3):
        m.append(0, 2)
        m.append(1, 2)
    assert m.block_table(0) == [0, 2, 4]
    assert m.block_table(1) == [1, 3, 5]
    assert m.contiguous_base(0) is None
    assert m.contiguous_base(1) is None
    # Freeing seq 1 then growing seq 0 hands it seq 1's old blocks, lowest first.
    m.free(1)
    m.append(0, 6)
    assert m.block_table(0) == [0, 2, 4, 1, 3, 5]
    assert m.contiguous_base(0) is None
    # Rolling seq 0 back and re-growing it hands back the very blocks it gave up, in the same order.
    m.truncate_to(0, 2)
    assert m.block_table(0) == [0]
    m.append(0, 6)
    assert m.block_table(0) == [0, 2, 4, 1]
    # A lone sequence allocated on a fresh pool and rolled back the same way stays one slice.
    m2 = BlockManager(12, 2, 64)
    m2.allocate(0)
    m2.append(0, 12)
    m2.truncate_to(0, 2)
    m2.append(0, 6)
    assert m2.block_table(0) == [0, 1, 2, 3]
    assert m2.contiguous_base(0) == 0
    check_invariants(m)


def test_sequences_are_independent():
    m = BlockManager(16, 4, 64)
    for s in range(3):
        m.allocate(s)
    m.append(0, 5)
    m.append(1, 9)
    m.append(2, 1)
    t1, t2 = m.block_table(1), m.block_table(2)
    m.truncate_to(0, 0)
    m.append(0, 13)
    assert m.block_table(1) == t1 and m.block_table(2) == t2
    assert (m.length(0), m.length(1), m.length(2)) == (13, 9, 1)
    check_invariants(m)


# --- randomized invariants --------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_random_operations_keep_invariants(seed):
    rng = random.Random(seed)
    m = BlockManager(num_blocks=24, block_size=rng.choice([1, 3, 4, 8]), max_seq_len=50)
    live: set[int] = set()
    next_id = 0
    counts = {"append": 0, "full": 0, "truncate": 0, "free": 0, "allocate": 0}
    for _ in range(3000):
        op = rng.random()
        if not live or op < 0.08:
            m.allocate(next_id)
            live.add(next_id)
            next_id += 1
            counts["allocate"] += 1
        elif op < 0.6:
            s = rng.choice(sorted(live))
            n = rng.randint(0, 12)
            before = snapshot(m)
            length = m.length(s)
            fits = length + n <= m.max_seq_len and m.blocks_needed(s, n) <= m.num_free
            try:
                assert m.append(s, n) == (length, length + n)
                assert fits
                counts["append"] += 1
            except CacheFullError:
                assert not fits
                assert snapshot(m) == before
                counts["full"] += 1
        elif op < 0.92:
            s = rng.choice(sorted(live))
            n = rng.randint(0, m.length(s))
            held_before = len(m.block_table(s))
            free_before = m.num_free
            table_before = m.block_table(s)
            m.truncate_to(s, n)
            assert m.length(s) == n
            assert m.block_table(s) == table_before[: ceil_div(n, m.block_size)]  # a prefix of the old table
            assert m.num_free == free_before + held_before - len(m.block_table(s))
            counts["truncate"] += 1
        else:
            s = rng.choice(sorted(live))
            free_before, held = m.num_free, len(m.block_table(s))
            m.free(s)
            live.discard(s)
            assert m.num_free == free_before + held
            counts["free"] += 1
        check_invariants(m)
        # The slot map of every live sequence is injective across the pool.
        slots = [x for s in live for x in m.slots(s, 0, m.length(s))]
        assert len(slots) == len(set(slots))
        assert all(0 <= x < m.num_blocks * m.block_size for x in slots)
    assert all(v > 20 for v in counts.values()), counts  # every kind of operation was exercised
