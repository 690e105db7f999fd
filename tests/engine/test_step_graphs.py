"""The fixed-shape passes a CUDA graph captures (engine.model.step_graphs), run without capture on the CPU: each
row of a pass equals a one-token step bit for bit, they agree with the eager path, they read scattered block
tables, and greedy speculation over them equals plain greedy. Capture itself needs a GPU (tests/engine/test_cuda.py)."""
from __future__ import annotations

import pytest
import torch

from engine.model.kv_cache import BlockManager, KVPool
from engine.model.row_padding import pad_short_passes
from engine.model.slot_view import slot_map
from engine.model.step_graphs import (
    StepGraphs,
    exact_graphs,
    graphs_wanted,
    rows_keep_their_bits,
)
from engine.model.transformer import Transformer
from tests.engine.test_exactness import greedy_identity
from tests.tiny import (
    ENGINE_CFG,
    QWEN2_TINY,
    hf_model,
    model_config,
    pass_and_steps,
    state_dict,
    tiny_engine,
)


def tiny(cfg: dict = QWEN2_TINY, fixed: bool = True) -> Transformer:
    model = Transformer.from_state_dict(model_config(cfg), state_dict(hf_model(cfg, 5)), torch.float32, "cpu", 512)
    if fixed:
        model.graphs = StepGraphs(capture=False)
    return model


def pool_for(model: Transformer, seqs: int = 1) -> KVPool:
    c = model.cfg
    pool = KVPool(c.num_layers, c.num_kv_heads, c.head_dim, BlockManager(32, 8, 200), torch.float32, "cpu")
    for s in range(seqs):
        pool.manager.allocate(s)
    return pool


def feed(model: Transformer, pool: KVPool, seq: int, ids: list[int]) -> torch.Tensor:
    start, end = pool.manager.append(seq, len(ids))
    return model(torch.tensor(ids), start, pool.view(seq, start, end))  # (T, V)


def test_slot_map_follows_the_block_table():
    table = torch.tensor([3, 0, 5, 0])  # blocks of 4; past the table, block 0 (masked by the view)
    assert slot_map(table, 4, 10).tolist() == [12, 13, 14, 15, 0, 1, 2, 3, 20, 21]


@pytest.mark.parametrize("cfg", [QWEN2_TINY, ENGINE_CFG], ids=["qwen2", "llama3"])
def test_each_row_of_a_fixed_shape_pass_is_a_step_bit_for_bit(cfg):
    model = tiny(cfg)
    pad_short_passes(model, probe=False)  # the CPU's BLAS rounds by row count; attention is what is tested here
    for n in (2, 5, 9, 16):
        together, steps = pass_and_steps(model, list(range(10, 40)), list(range(50, 50 + n)))
        assert torch.equal(together, steps), n


def test_fixed_shape_passes_agree_with_the_eager_path():
    fixed, eager = tiny(), tiny(fixed=False)
    a, b = pool_for(fixed), pool_for(eager)
    feed(fixed, a, 0, list(range(10, 60)))  # prefill (50 rows): eager in both
    feed(eager, b, 0, list(range(10, 60)))
    for ids in ([7], [8, 9, 10], list(range(20, 36))):
        x, y = feed(fixed, a, 0, ids), feed(eager, b, 0, ids)
        assert x.shape == y.shape
        torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4)
        assert torch.equal(x.argmax(-1), y.argmax(-1))
    assert not torch.equal(x, torch.zeros_like(x))


def test_fixed_shape_passes_read_a_scattered_block_table():
    """Two sequences grown in turns interleave their blocks: the slot map must follow each one's table."""
    fixed, eager = tiny(), tiny(fixed=False)
    a, b = pool_for(fixed, 2), pool_for(eager, 2)
    for step in range(6):
        for seq in (0, 1):
            ids = [20 + 3 * step + seq, 40 + seq, 11] if step % 2 else [30 + step + seq]
            x, y = feed(fixed, a, seq, ids), feed(eager, b, seq, ids)
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-4)
    assert a.manager.contiguous_base(0) is None  # the tables really were scattered
    last_only = fixed(torch.tensor([5, 6]), a.manager.length(1), a.view(1, *a.manager.append(1, 2)), last_only=True)
    assert last_only.shape == (1, QWEN2_TINY["vocab_size"])


def test_a_rollback_then_another_pass_reads_the_rewritten_positions():
    fixed, eager = tiny(), tiny(fixed=False)
    a, b = pool_for(fixed), pool_for(eager)
    for model, pool in ((fixed, a), (eager, b)):
        feed(model, pool, 0, list(range(10, 30)))
        feed(model, pool, 0, [1, 2, 3, 4, 5])
        pool.manager.truncate_to(0, 22)  # three of the five rejected
    torch.testing.assert_close(feed(fixed, a, 0, [60, 61]), feed(eager, b, 0, [60, 61]), rtol=1e-4, atol=1e-4)


def test_a_model_moved_to_another_pool_reads_that_pool():
    """A new pool (another context length) is new addresses: the static buffers are made again for it."""
    fixed, eager = tiny(), tiny(fixed=False)
    for _ in range(2):  # and back: each pool's passes read that pool's cache
        a, b = pool_for(fixed), pool_for(eager)
        for ids in (list(range(10, 40)), [3], [4, 5]):
            torch.testing.assert_close(feed(fixed, a, 0, ids), feed(eager, b, 0, ids), rtol=1e-4, atol=1e-4)
    assert fixed.graphs._pool is a


@pytest.mark.parametrize("drafter, k", [("model", 3), ("model", 16), ("hybrid", 5)])
def test_greedy_speculation_over_fixed_shape_passes_equals_plain(drafter, k):
    engine = tiny_engine()
    for model in (engine.target, engine.draft):
        model.graphs = StepGraphs(capture=False)
    drafted, accepted, _, _ = greedy_identity(engine, drafter, k)
    assert drafted > 0 and accepted > 0


def test_graphs_can_be_turned_off(monkeypatch):
    assert graphs_wanted()
    monkeypatch.setenv("SPECLENS_CUDA_GRAPHS", "0")
    assert not graphs_wanted()


class _FakeStream:
    def wait_stream(self, other) -> None:
        pass


class _Refusing:
    """A capture that fails as an op that cannot be captured does (or as the GPU's memory running out)."""

    def __init__(self, error: type[Exception]) -> None:
        self.error = error

    def __call__(self, *args, **kwargs):
        raise self.error("operation not permitted when stream is capturing")


def _fake_cuda(monkeypatch, error: type[Exception]) -> None:
    import contextlib

    monkeypatch.setattr(torch.cuda, "graph_pool_handle", lambda: object())
    monkeypatch.setattr(torch.cuda, "Stream", lambda device=None: _FakeStream())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: _FakeStream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", lambda: object())
    monkeypatch.setattr(torch.cuda, "graph", _Refusing(error))


def test_a_failed_capture_falls_back_to_the_same_passes_uncaptured(monkeypatch):
    _fake_cuda(monkeypatch, RuntimeError)
    fixed, eager = tiny(), tiny(fixed=False)
    fixed.graphs = StepGraphs(capture=True)
    a, b = pool_for(fixed), pool_for(eager)
    for ids in (list(range(10, 40)), [3], [4, 5], [6]):
        torch.testing.assert_close(feed(fixed, a, 0, ids), feed(eager, b, 0, ids), rtol=1e-4, atol=1e-4)
    assert not fixed.graphs.capture and not fixed.graphs.captured


def test_running_out_of_memory_while_capturing_is_not_taken_for_an_uncapturable_op(monkeypatch):
    _fake_cuda(monkeypatch, torch.cuda.OutOfMemoryError)
    fixed = tiny()
    fixed.graphs = StepGraphs(capture=True)
    pool = pool_for(fixed)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        feed(fixed, pool, 0, [3, 4])
    assert fixed.graphs.capture  # the next pass tries again


def test_a_dropped_model_is_freed_at_once_graphs_and_all():
    """No reference cycle between a model and its graphs: on a GPU, a model dropped (another pair loaded) must give
    its memory back when the last reference goes, not whenever the cycle collector next runs."""
    import gc
    import weakref

    model = tiny()
    pool = pool_for(model)
    feed(model, pool, 0, [3, 4, 5])
    gone = weakref.ref(model)
    gc.disable()
    try:
        del model
        assert gone() is None
    finally:
        gc.enable()


def test_the_padded_attention_keeps_each_rows_bits_wherever_it_sits():
    assert rows_keep_their_bits(4, 2, 16, 200, "cpu", torch.float32)
    assert rows_keep_their_bits(14, 2, 64, 300, "cpu", torch.bfloat16)  # the draft's head layout, in bf16


def test_no_graphs_where_the_attention_would_round_a_row_by_its_place(monkeypatch):
    import engine.model.step_graphs as sg

    honest = sg.padded_rows

    def by_place(q, keys, values, bias):  # a library whose kernels round the rows after the first otherwise
        out = honest(q, keys, values, bias)
        out[1:] = out[1:] * (1 + 2**-20)
        return out

    cfg = model_config(QWEN2_TINY)
    assert isinstance(exact_graphs(cfg, 128, "cpu", torch.float32), StepGraphs)
    monkeypatch.setattr(sg, "padded_rows", by_place)
    assert not rows_keep_their_bits(4, 2, 16, 128, "cpu", torch.float32)
    assert exact_graphs(cfg, 128, "cpu", torch.float32) is None
