"""A folder of safetensors on the CPU runs on the kernels' F32 units and the C++ stack (engine.cpu.dense): the
transformers model's logits, a pass scored bit for bit as one-token steps, and greedy speculation exact, with the
draft re-quantized to Q4_0."""
from __future__ import annotations

import copy

import pytest
import torch

from engine.api.config import CacheConfig, SamplingParams, SpecParams
from engine.cpu import QuantLinear, ext, kernels_name
from engine.cpu.dense import run_on_kernels
from engine.cpu.formats import T
from engine.io.loading import load_engine
from engine.model.cpu_linear import PackedLinear
from engine.model.transformer import Transformer
from tests.tiny import (
    ENGINE_CFG,
    QWEN2_TINY,
    draft_weights,
    hf_model,
    model_config,
    pass_and_steps,
    save_folder,
    state_dict,
    tiny_tokenizer,
)

# Widths in whole F32 units (32 inputs); Qwen2 for the q/k/v biases, the engine's Llama-3.2 config for tied embeddings
QWEN2 = dict(QWEN2_TINY, intermediate_size=128, vocab_size=ENGINE_CFG["vocab_size"])


@pytest.fixture(scope="module", params=["llama", "qwen2", "llama-bf16"])
def pair(request, tmp_path_factory, kernels):
    """(config, the transformers target in fp32, target folder, draft folder). llama-bf16 is saved in bf16, as
    real checkpoints are: its matrices then run as BF16 units."""
    cfg = QWEN2 if request.param == "qwen2" else ENGINE_CFG
    root = tmp_path_factory.mktemp(request.param)
    target, draft = hf_model(cfg, 0), hf_model(cfg, 0)
    draft.load_state_dict(draft_weights(dict(target.state_dict()), 0.03, 1))
    tok = tiny_tokenizer()
    if not request.param.endswith("bf16"):
        return request.param, target, save_folder(target, tok, root / "t"), save_folder(draft, tok, root / "d")
    folders = (save_folder(copy.deepcopy(target).to(torch.bfloat16), tok, root / "t"),
               save_folder(draft.to(torch.bfloat16), tok, root / "d"))
    # The reference: the same bf16 weights in the fp32 model (casting the model itself would round its rope too)
    target.load_state_dict({k: v.to(torch.bfloat16).float() for k, v in target.state_dict().items()})
    return request.param, target, *folders


def test_a_dense_target_runs_on_the_kernels_and_computes_the_transformers_model(pair):
    kind, hf, t, d = pair
    engine = load_engine(str(t), str(d), device="cpu", cache=CacheConfig(max_seq_len=128))
    model = engine.target
    assert isinstance(model.layers[0].mlp.down, QuantLinear) and isinstance(model.lm_head, QuantLinear)
    units = T.BF16 if kind.endswith("bf16") else T.F32  # a bf16 checkpoint's weights stay bf16, in half the bytes
    assert model.layers[0].mlp.down.qtype == model.layers[1].attn.qkv.qtype == model.lm_head.qtype == units
    assert model.stack is not None and engine.target_pool.k.dtype == torch.float32
    assert engine.dtype_name == f"float32, {kernels_name()}"  # the loaded-model line says what runs it
    draft = engine.draft  # re-quantized to Q4_0 blocks (DRAFT_REQUANT), on the stack too
    assert draft.layers[0].mlp.down.qtype == draft.lm_head.qtype == T.Q4_0 and draft.stack is not None
    ids = [1, 40, 7, 99, 3, 12, 61, 5]
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]  # (T, V)
    prompt, rest = ids[:3], ids[3:]
    _, steps = pass_and_steps(model, prompt, rest)  # through the stack, one token at a time
    torch.testing.assert_close(steps, ref[3:], rtol=1e-4, atol=1e-4)


def test_a_dense_pass_scores_each_row_exactly_as_a_step(pair):
    _, _, t, _ = pair
    model = load_engine(str(t), None, device="cpu", cache=CacheConfig(max_seq_len=128)).target
    for n in (2, 5, 9, 16):
        together, steps = pass_and_steps(model, [1, 40, 7, 99], list(range(10, 10 + n)))
        assert torch.equal(together, steps), n


def test_greedy_speculation_over_a_dense_pair_equals_plain(pair):
    _, _, t, d = pair
    engine = load_engine(str(t), str(d), device="cpu", cache=CacheConfig(max_seq_len=256))
    greedy = SamplingParams(max_new_tokens=40)
    prompt = engine.encode_chat([{"role": "user", "content": "def f(x): return x + 1"}])
    *_, plain = engine.generate(prompt, greedy, SpecParams(enabled=False))
    for k in (1, 4, 16):
        engine.reset()
        *_, spec = engine.generate(prompt, greedy, SpecParams(k=k))
        assert spec.token_ids == plain.token_ids, k
        assert spec.accepted > 0


def test_without_the_kernels_or_whole_units_a_dense_model_stays_as_it_was(monkeypatch):
    odd = dict(QWEN2_TINY)  # intermediate size 112: not whole units of 32
    model = Transformer.from_state_dict(model_config(odd), state_dict(hf_model(odd, 2)), torch.float32, "cpu", 64)
    assert not run_on_kernels(model) and model.stack is None and type(model.lm_head) is not QuantLinear
    monkeypatch.setattr(ext, "load", lambda: None)
    cfg = dict(QWEN2)
    model = Transformer.from_state_dict(model_config(cfg), state_dict(hf_model(cfg, 2)), torch.float32, "cpu", 64)
    assert not run_on_kernels(model) and model.stack is None


def test_without_the_kernels_a_dense_folder_falls_back_to_onednn(pair, monkeypatch):
    _, _, t, _ = pair
    monkeypatch.setattr(ext, "load", lambda: None)
    model = load_engine(str(t), None, device="cpu", cache=CacheConfig(max_seq_len=64)).target
    assert isinstance(model.layers[0].mlp.down, PackedLinear) or not torch.backends.mkldnn.is_available()
