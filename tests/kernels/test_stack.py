"""The C++ decoder stack (engine/cpu/stack.py): same model as the torch modules, batch-invariant, same bits
on every instruction set and thread count, over contiguous and scattered KV blocks, in fp32 and fp16 pools."""
from __future__ import annotations

import pytest
import torch

from engine.cpu import ext, kernels_available
from engine.io.gguf_file import GGUFFile
from engine.io.gguf_model import build_model
from engine.model.kv_cache import BlockManager, CacheView, KVPool
from engine.model.transformer import Transformer

try:
    from isa import outputs_per_isa_and_threads
    from test_weights import make_hf_model, make_tokenizer, write_gguf
except ImportError:  # tests/ imported as a package
    from tests.engine.test_weights import make_hf_model, make_tokenizer, write_gguf
    from tests.isa import outputs_per_isa_and_threads

# Without the compiled kernels there is no stack to test (the torch modules run instead; tests/kernels/test_kernels.py
# tests that fallback). A build that fails where it should not is caught by tests/engine/test_embedded.py, which requires it.
pytestmark = pytest.mark.skipif(not kernels_available(), reason="the C++ kernels did not build here")
MAX_LEN = 64
IDS = [5, 17, 99, 3, 42, 7, 250, 1, 64, 12, 88]


@pytest.fixture(scope="module", params=[("llama", "Q8_0"), ("qwen2", "mixed"), ("llama", "F16"), ("qwen2", "parts")])
def gguf_path(request, tmp_path_factory):
    arch, qtype = request.param
    tok = make_tokenizer()
    return write_gguf(tmp_path_factory.mktemp("g") / f"{arch}-{qtype}.gguf", make_hf_model(arch, len(tok)), tok, qtype)


KV_DTYPES = [torch.float32, torch.float16]


def run(model: Transformer, widths: list[int], scatter: bool = False, kv: torch.dtype = torch.float32) -> torch.Tensor:
    """Logits of IDS fed in passes of the given widths. scatter: another sequence takes every other block,
    so this one's block table is not contiguous and the stack reads through its slot list. kv: the pool's dtype."""
    cfg = model.cfg
    mgr = BlockManager(16, 2, MAX_LEN)
    pool = KVPool(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, mgr, kv, "cpu")
    mgr.allocate(0)
    if scatter:
        mgr.allocate(1)
    out, i = [], 0
    for w in widths:
        start, end = mgr.append(0, w)
        if scatter:
            mgr.append(1, 2)
        out.append(model(torch.tensor(IDS[i : i + w]), start, pool.view(0, start, end)))
        i += w
    return torch.cat(out)  # (len(IDS), V)


def test_the_stack_is_the_module_path(gguf_path):
    """Exact activations: the C++ layers compute what the torch modules compute, up to the order of sums."""
    model = build_model(GGUFFile(gguf_path), MAX_LEN, act="fp32")
    assert model.stack is not None
    fast = run(model, [1] * len(IDS))
    model.stack = None
    ref = run(model, [1] * len(IDS))
    torch.testing.assert_close(fast, ref, rtol=1e-5, atol=1e-5)
    assert not torch.equal(fast, torch.zeros_like(fast))


def test_layers_of_parts_of_different_types_are_the_module_path(tmp_path):
    """int8 activations through q|k|v and gate|up stored as parts of different block types (the kernels run them in
    one call, each part into its columns): the torch modules' result (each part its own matmul) up to attention's
    and the norms' order of sums."""
    tok = make_tokenizer()
    gf = GGUFFile(write_gguf(tmp_path / "parts.gguf", make_hf_model("qwen2", len(tok)), tok, "parts"))
    assert {gf.tensors["blk.0.attn_" + n + ".weight"].qtype.name for n in "qkv"} == {"Q8_0", "Q5_0", "Q4_0"}
    model = build_model(gf, MAX_LEN)
    assert model.stack is not None and len(model.layers[0].attn.qkv.parts) == 3
    fast = run(model, [1, 3, 7])
    model.stack = None
    ref = run(model, [1, 3, 7])
    torch.testing.assert_close(fast, ref, rtol=1e-4, atol=1e-4)
    assert fast.abs().max() > 1e-3


@pytest.mark.parametrize("kv", KV_DTYPES, ids=["kv32", "kv16"])
@pytest.mark.parametrize("act", ["int8", "fp32"])
def test_passes_are_batch_invariant_and_block_layout_free(gguf_path, act, kv):
    model = build_model(GGUFFile(gguf_path), MAX_LEN, act=act)
    steps = run(model, [1] * len(IDS), kv=kv)
    for widths in ([len(IDS)], [3, 8], [2, 5, 4]):
        assert torch.equal(run(model, widths, kv=kv), steps), widths
    assert torch.equal(run(model, [4, 7], scatter=True, kv=kv), steps)


@pytest.mark.parametrize("kv", KV_DTYPES, ids=["kv32", "kv16"])
def test_same_bits_on_every_isa_and_thread_count(gguf_path, kv):
    """fp16 pools included: the scalar code's float_to_half / half_to_float and F16C round and widen alike."""
    model = build_model(GGUFFile(gguf_path), MAX_LEN)
    outs = outputs_per_isa_and_threads(lambda: run(model, [3, 8], scatter=True, kv=kv))
    first = next(iter(outs.values()))
    assert len(outs) >= 2 and all(torch.equal(first, y) for y in outs.values()), list(outs)


def test_bad_calls_raise_value_errors(gguf_path):
    model = build_model(GGUFFile(gguf_path), MAX_LEN)
    cfg = model.cfg
    pool = KVPool(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, BlockManager(16, 2, MAX_LEN), torch.float32, "cpu")
    x = torch.zeros(17, cfg.hidden_size)
    with pytest.raises(ValueError, match="T <= 16"):
        model.stack(x, 0, CacheView(pool, torch.arange(17), None, 0, 17))
    with pytest.raises(ValueError, match="write slot out of range"):
        model.stack(x[:2], 0, CacheView(pool, torch.tensor([0, 10**6]), None, 0, 2))
    with pytest.raises(ValueError, match="contiguous read beyond the cache"):
        model.stack(x[:2], 0, CacheView(pool, torch.arange(2), None, 31, 2))
    with pytest.raises(ValueError, match="rotary"):
        model.stack(x[:1], MAX_LEN, CacheView(pool, torch.arange(1), None, 0, 1))
    bf16 = KVPool(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, BlockManager(16, 2, MAX_LEN), torch.bfloat16, "cpu")
    with pytest.raises(ValueError, match="float32 or float16"):
        model.stack(x[:1], 0, CacheView(bf16, torch.arange(1), None, 0, 1))


def test_without_the_kernels_the_modules_run(gguf_path, monkeypatch):
    fast = run(build_model(GGUFFile(gguf_path), MAX_LEN, act="fp32"), [1] * len(IDS))
    monkeypatch.setattr(ext, "load", lambda: None)
    model = build_model(GGUFFile(gguf_path), MAX_LEN, act="fp32")
    assert model.stack is None
    torch.testing.assert_close(run(model, [1] * len(IDS)), fast, rtol=1e-4, atol=1e-4)


# Real head sizes (64 and 128 take the attention's compiled-width paths) and a context several key chunks long
# (engine/cpu/csrc/attend.h: KEY_CHUNK = 128 keys per work item, merged in order).
LONG = 300  # prompt tokens before the passes: three chunks


@pytest.fixture(scope="module", params=[("llama", 4, 2), ("qwen2", 2, 1)], ids=["D64", "D128"])
def wide_model(request, tmp_path_factory):
    arch, heads, kv_heads = request.param
    tok = make_tokenizer()
    hf = make_hf_model(arch, len(tok), hidden_size=256, num_attention_heads=heads, num_key_value_heads=kv_heads,
                       max_position_embeddings=512)
    path = write_gguf(tmp_path_factory.mktemp("w") / f"{arch}.gguf", hf, tok, "Q8_0")
    return path, len(tok)


def run_long(model: Transformer, vocab: int, widths: list[int], kv: torch.dtype = torch.float32) -> torch.Tensor:
    """Logits of passes of the given widths after a LONG-token prompt, over scattered KV blocks."""
    cfg = model.cfg
    mgr = BlockManager(96, 4, 384)
    pool = KVPool(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, mgr, kv, "cpu")
    mgr.allocate(0)
    mgr.allocate(1)
    gen = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, vocab, (LONG,), generator=gen)
    ids = torch.randint(0, vocab, (sum(widths),), generator=gen)
    for s in range(0, LONG, 60):  # chunks of 60 interleaved with another sequence: a scattered block table
        start, end = mgr.append(0, min(60, LONG - s))
        mgr.append(1, 4)
        model(prompt[s : s + 60], start, pool.view(0, start, end))
    out, i = [], 0
    for w in widths:
        start, end = mgr.append(0, w)
        out.append(model(ids[i : i + w], start, pool.view(0, start, end)))
        i += w
    return torch.cat(out)


@pytest.mark.parametrize("kv", KV_DTYPES, ids=["kv32", "kv16"])
def test_long_contexts_at_real_head_sizes(wide_model, kv):
    path, vocab = wide_model
    model = build_model(GGUFFile(path), 512, act="fp32")
    assert model.cfg.head_dim in (64, 128)
    steps = run_long(model, vocab, [1] * 9, kv)
    for widths in ([9], [3, 6], [2, 5, 2]):
        assert torch.equal(run_long(model, vocab, widths, kv), steps), widths
    outs = outputs_per_isa_and_threads(lambda: run_long(model, vocab, [4, 5], kv))
    assert len(outs) >= 2 and all(torch.equal(steps, y) for y in outs.values()), list(outs)
    if kv == torch.float16:  # the pool's type is not lost on the way: its rounding shows
        assert not torch.equal(steps, run_long(model, vocab, [1] * 9, torch.float32))
    model.stack = None  # the torch modules: one softmax over all keys, not chunks merged
    torch.testing.assert_close(steps, run_long(model, vocab, [1] * 9, kv), rtol=1e-5, atol=1e-5)
