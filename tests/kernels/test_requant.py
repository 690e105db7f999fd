"""Q4_0 re-quantization (a cheaper draft model): the C++ requantizer against a numpy statement of ggml's rule."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf.quants import dequantize as gguf_dequantize
from gguf.quants import quantize as gguf_quantize

from engine.cpu import ext
from engine.cpu.formats import FORMATS, T, random_rows
from engine.cpu.linear import QuantLinear
from tests.isa import outputs_per_isa_and_threads

pytestmark = pytest.mark.skipif(ext.load() is None, reason="the quantized kernels did not build")

SOURCES = [t for t in FORMATS if t != T.Q4_0]


def q4_0_reference(w: np.ndarray) -> np.ndarray:
    """ggml's quantize_row_q4_0_ref in float32 and the weights it stands for: (N, K) -> (N, K)."""
    blocks = w.reshape(-1, 32).astype(np.float32)
    pick = np.abs(blocks).argmax(-1)  # the first of equal magnitudes, as ggml's strict '<' keeps
    mx = blocks[np.arange(len(blocks)), pick]
    d = mx / np.float32(-8)
    with np.errstate(divide="ignore"):
        inv = np.where(d != 0, np.float32(1) / d, np.float32(0)).astype(np.float32)
    q = np.minimum(15, np.trunc(blocks * inv[:, None] + np.float32(8.5)).astype(np.int8))
    d16 = d.astype(np.float16).astype(np.float32)
    return (d16[:, None] * (q.astype(np.float32) - 8)).reshape(w.shape)


def exact_weights(lin: QuantLinear) -> np.ndarray:
    return lin.dequantize().numpy()


@pytest.mark.parametrize("qtype", SOURCES, ids=lambda t: t.name)
def test_requantized_weights_follow_ggml_rule(qtype):
    n, k = 21, 512  # a last group of 5 outputs
    raw = random_rows(qtype, n, k, np.random.default_rng(int(qtype)))
    src = QuantLinear(raw, qtype, k)
    q4 = src.requantized(T.Q4_0)
    assert (q4.qtype, q4.out_features, q4.in_features) == (int(T.Q4_0), n, k)
    np.testing.assert_array_equal(exact_weights(q4), q4_0_reference(exact_weights(src)))


def test_the_same_q4_0_bytes_on_every_isa():
    """The vectorized re-quantizers give the scalar statement's bytes (half signs and subnormal scales included)."""
    if len(ext.load().supported_isas()) < 2:
        pytest.skip("this CPU runs only the scalar kernels: nothing to compare")
    rng = np.random.default_rng(5)
    w = rng.standard_normal((37, 512)).astype(np.float32) * np.logspace(-7, 4.5, 37, dtype=np.float32)[:, None]
    w[4] = 0.0
    sources = [QuantLinear(w.view(np.uint8), T.F32, 512)]
    sources += [QuantLinear(random_rows(q, 21, 512, rng), q, 512) for q in SOURCES if q != T.F32]
    for src in sources:
        outs = outputs_per_isa_and_threads(lambda: src.requantized(T.Q4_0).packed.clone())
        scalar = outs[("scalar", 1)]
        assert all(torch.equal(scalar, o) for o in outs.values()), (T(src.qtype).name, list(outs))


def test_half_scales_round_to_nearest_even_over_the_whole_range():
    """Blocks scaled from half subnormals (1e-7) to near the half maximum: every d is numpy's float16 rounding."""
    rng = np.random.default_rng(7)
    n, k = 64, 256
    w = rng.standard_normal((n, k)).astype(np.float32) * np.logspace(-7, 4.5, n, dtype=np.float32)[:, None]
    w[3] = 0.0  # an all-zero output: d = 0, every quant 8
    src = QuantLinear(w.view(np.uint8), T.F32, k)
    q4 = src.requantized(T.Q4_0)
    np.testing.assert_array_equal(exact_weights(q4), q4_0_reference(w))
    assert not exact_weights(q4)[3].any()


def test_the_same_bits_as_gguf_quantize_on_real_looking_weights():
    """gguf-py's own Q4_0 quantizer (the file format's reference) agrees on all but rounding-tie blocks."""
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((128, 896)) * 0.02).astype(np.float32)
    ours = exact_weights(QuantLinear(w.view(np.uint8), T.F32, 896).requantized(T.Q4_0))
    theirs = gguf_dequantize(gguf_quantize(w, T.Q4_0), T.Q4_0).reshape(w.shape)
    same_blocks = (ours.reshape(-1, 32) == theirs.reshape(-1, 32)).all(-1).mean()
    assert same_blocks > 0.999


def test_a_requantized_layer_computes_with_its_new_weights():
    rng = np.random.default_rng(11)
    n, k = 40, 896
    src = QuantLinear(random_rows(T.Q5_0, n, k, rng), T.Q5_0, k, bias=torch.randn(n))
    q4 = src.requantized(T.Q4_0)
    x = torch.randn(3, k)
    want = x @ torch.from_numpy(exact_weights(q4)).T + src.bias
    torch.testing.assert_close(q4(x), want, rtol=0.02, atol=0.02 * float(want.abs().max()))
    assert q4.nbytes < src.nbytes  # 4.5 bits per weight instead of 5.5


def test_only_q4_0_is_a_requantization_target():
    lin = QuantLinear(random_rows(T.Q8_0, 8, 64, np.random.default_rng(0)), T.Q8_0, 64)
    with pytest.raises(ValueError, match="Q4_0"):
        lin.requantized(T.Q5_0)


def test_a_requantized_draft_keeps_speculation_exact(tmp_path):
    """A Q8_0 draft built with requant=Q4_0 runs every matrix as Q4_0; the target still decides every token, so
    greedy speculative output equals plain. (What acceptance it costs on the real pair is a benchmark's figure:
    this tiny random model's weights are far from a trained model's.)"""
    from engine.api.config import CacheConfig, SamplingParams, SpecParams
    from engine.io.gguf_file import GGUFFile
    from engine.io.gguf_model import build_model
    from engine.runtime.engine import Engine
    from tests.engine.test_exactness import PROMPTS, quantized_pair

    target, _, tok = quantized_pair(tmp_path)
    draft = build_model(GGUFFile(tmp_path / "draft.gguf"), 256, requant=T.Q4_0)
    kinds = {m.qtype for m in draft.modules() if isinstance(m, QuantLinear)}
    assert kinds == {int(T.Q4_0)}
    greedy = SamplingParams(temperature=0.0, max_new_tokens=30)
    engine = Engine(target, tok, draft, cache=CacheConfig(block_size=8, max_seq_len=256))
    accepted = 0
    for messages in PROMPTS:
        prompt = engine.encode_chat(messages)
        engine.reset()
        *_, plain = engine.generate(prompt, greedy, SpecParams(enabled=False))
        engine.reset()
        *_, spec = engine.generate(prompt, greedy, SpecParams(k=4))
        assert spec.token_ids == plain.token_ids
        accepted += spec.accepted
    assert accepted > 0
