"""A GGUF run as it is (quantized kernels) computes the same model as its dequantized float32 weights,
and speculative decoding over it stays exact."""
from __future__ import annotations

import pytest
import torch

from engine.api.config import CacheConfig, SamplingParams, SpecParams
from engine.cpu import QuantLinear, kernels_name
from engine.io.gguf_file import GGUFFile
from engine.io.gguf_model import build_model
from engine.io.loading import load_engine
from engine.io.weights import load_checkpoint
from engine.model.kv_cache import BlockManager, KVPool
from engine.model.transformer import Transformer

try:
    from test_weights import make_hf_model, make_tokenizer, write_gguf
except ImportError:  # tests/ imported as a package
    from tests.engine.test_weights import make_hf_model, make_tokenizer, write_gguf

MAX_LEN = 64


@pytest.fixture(scope="module")
def tok():
    return make_tokenizer()


@pytest.fixture(scope="module", params=[("llama", "Q8_0"), ("qwen2", "mixed"), ("llama", "F16")])
def gguf_path(request, tok, tmp_path_factory):
    arch, qtype = request.param
    return write_gguf(tmp_path_factory.mktemp("g") / f"{arch}-{qtype}.gguf", make_hf_model(arch, len(tok)), tok, qtype)


def logits(model: Transformer, ids: list[int]) -> torch.Tensor:
    cfg = model.cfg
    pool = KVPool(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, BlockManager(8, 16, MAX_LEN), torch.float32, "cpu")
    pool.manager.allocate(0)
    start, end = pool.manager.append(0, len(ids))
    return model(torch.tensor(ids), start, pool.view(0, start, end))  # (T, V)


def test_quantized_model_equals_its_dequantized_weights(gguf_path):
    gf = GGUFFile(gguf_path)
    ck = load_checkpoint(gguf_path)  # float32, dequantized by gguf.quants, q/k un-permuted
    dense = Transformer.from_state_dict(ck.config, ck.tensors, torch.float32, "cpu", MAX_LEN)
    exact = build_model(gf, MAX_LEN, act="fp32")
    ids = [5, 17, 99, 3, 42, 7, 250, 1, 64]
    ref = logits(dense, ids)
    # Same weights bit for bit; only the order of the fp32 sums differs.
    torch.testing.assert_close(logits(exact, ids), ref, rtol=1e-4, atol=1e-4)
    for name, module in exact.named_modules():
        if isinstance(module, QuantLinear) and "qkv" in name and "0" in name.split("."):
            w = module.dequantize()
            assert torch.equal(w, dense.get_submodule(name).weight), name  # llama q/k rows un-permuted exactly
    # int8 activations: per-32 rounding of each activation; the next-token choice holds on this tiny model.
    fast = logits(build_model(gf, MAX_LEN, act="int8"), ids)
    assert (fast - ref).abs().max() < 0.05 * ref.abs().max()
    assert torch.equal(fast.argmax(-1), ref.argmax(-1))


def test_rows_are_batch_invariant_through_the_whole_model(gguf_path):
    model = build_model(GGUFFile(gguf_path), MAX_LEN)
    ids = [5, 17, 99, 3, 42, 7, 250, 1, 64]
    together = logits(model, ids)
    cfg = model.cfg
    pool = KVPool(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, BlockManager(8, 16, MAX_LEN), torch.float32, "cpu")
    pool.manager.allocate(0)
    one_by_one = []
    for i, t in enumerate(ids):
        start, end = pool.manager.append(0, 1)
        one_by_one.append(model(torch.tensor([t]), start, pool.view(0, start, end)))
    assert torch.equal(torch.cat(one_by_one), together)  # bitwise: a verify pass scores exactly like decode steps


def test_a_verify_of_more_rows_than_one_short_pass_scores_each_as_a_step(gguf_path):
    """The app's K goes to 16 (the API's to 64): K + 1 rows past ROW_WISE_MAX are verified in short passes, each
    scoring its rows exactly as decode steps do; one long pass would attend with the fused kernel and differ."""
    from engine.runtime.verify import score

    model = build_model(GGUFFile(gguf_path), MAX_LEN)
    cfg = model.cfg
    ids, drafted = [5, 17, 99, 3], list(range(20, 40))  # K = 20: passes of 16 and 5 rows

    def pool_after(prefix):
        pool = KVPool(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, BlockManager(8, 16, MAX_LEN), torch.float16, "cpu")
        pool.manager.allocate(0)
        start, end = pool.manager.append(0, len(prefix))
        model(torch.tensor(prefix), start, pool.view(0, start, end))
        return pool

    verified = score(model, pool_after(ids[:-1]), ids, torch.tensor(drafted), SamplingParams(temperature=0.0),
                     cfg.vocab_size, torch.device("cpu")).logits
    pool, steps = pool_after(ids[:-1]), []
    for t in [ids[-1], *drafted]:
        start, end = pool.manager.append(0, 1)
        steps.append(model(torch.tensor([t]), start, pool.view(0, start, end)))
    assert verified.shape == (21, cfg.vocab_size)
    assert torch.equal(verified, torch.cat(steps))


def gguf_pair_engine(tok, folder, device: str):
    """A Q8_0 Qwen2 pair written as GGUF files and loaded on `device`, running to the length limit."""
    target = write_gguf(folder / "t.gguf", make_hf_model("qwen2", len(tok)), tok, "Q8_0")
    draft = write_gguf(folder / "d.gguf", make_hf_model("qwen2", len(tok), num_hidden_layers=1), tok, "Q8_0")
    engine = load_engine(str(target), str(draft), device=device, cache=CacheConfig(max_seq_len=128))
    engine.eos_ids = set()  # random weights: run to the length limit
    return engine


def assert_greedy_identity(engine, drafter: str, ks: tuple[int, ...]) -> None:
    greedy = SamplingParams(max_new_tokens=40)
    for prompt in ([5, 17, 99, 3], [42, 42, 7, 42, 42, 7, 42]):
        engine.reset()
        *_, plain = engine.generate(prompt, greedy, SpecParams(enabled=False))
        for k in ks:
            engine.reset()
            *_, spec = engine.generate(prompt, greedy, SpecParams(k=k, drafter=drafter))
            assert spec.token_ids == plain.token_ids, (drafter, k)


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_greedy_speculative_equals_plain_on_quantized_models(tok, tmp_path, drafter):
    engine = gguf_pair_engine(tok, tmp_path, "cpu")
    assert isinstance(engine.target.layers[0].mlp.down, QuantLinear)
    assert engine.target_pool.k.dtype == engine.model_drafter.pool.k.dtype == torch.float16  # GGUF models' caches
    assert_greedy_identity(engine, drafter, (1, 4, 8))


def test_gguf_pair_check_reads_vocabularies_from_the_files(tok, tmp_path, monkeypatch):
    from engine.io import loading
    from engine.io.weights import ModelLoadError

    target = write_gguf(tmp_path / "t.gguf", make_hf_model("qwen2", len(tok)), tok, "Q8_0")
    tgt, dft = load_checkpoint(target, dequantize=False), load_checkpoint(target, dequantize=False)
    loading.check_pair(tgt, dft)
    assert "tokenizer" not in vars(dft) and "tokenizer" not in vars(tgt)  # nothing built for the check
    tokens = list(dft.gguf.metadata["tokenizer.ggml.tokens"])
    tokens[7], tokens[8] = tokens[8], tokens[7]
    monkeypatch.setitem(dft.gguf.metadata, "tokenizer.ggml.tokens", tokens)
    with pytest.raises(ModelLoadError, match=f"token 7 is {tokens[8]!r} in the target and {tokens[7]!r} in the draft"):
        loading.check_pair(tgt, dft)


def test_engine_names_the_files_quantization(tok, tmp_path):
    path = write_gguf(tmp_path / "t.gguf", make_hf_model("qwen2", len(tok)), tok, "Q8_0")
    assert GGUFFile(path).file_type == "GGUF"  # this writer states no file type
    engine = load_engine(str(path), None, device="cpu", cache=CacheConfig(max_seq_len=64))
    assert engine.dtype_name == f"GGUF, int8 activations, {kernels_name()}"


def test_the_kernels_are_named_for_the_user(monkeypatch):
    from engine.cpu import ext

    class Kernels:
        def __init__(self, isa):
            self.isa = lambda: isa
            self.isa_table = lambda: [("scalar", "scalar"), ("avx2", "AVX2"), ("avxvnni", "AVX-VNNI"),
                                      ("avx512vnni", "AVX-512 VNNI")]

    for isa, shown in (("avx512vnni", "AVX-512 VNNI kernels"), ("avxvnni", "AVX-VNNI kernels"), ("avx2", "AVX2 kernels"),
                       ("scalar", "scalar kernels")):
        monkeypatch.setattr(ext, "load", lambda isa=isa: Kernels(isa))
        assert kernels_name() == shown
    monkeypatch.setattr(ext, "load", lambda: None)
    assert kernels_name() == "pure-torch fallback"
