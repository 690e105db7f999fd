"""The CPU fast paths: prepacked fp32 matches F.linear; an int8 draft keeps the output exact."""
import pytest
import torch
from torch import nn

from engine.api.config import SamplingParams, SpecParams
from engine.model.cpu_linear import (
    Int8Linear,
    PackedLinear,
    int8_supported,
    packed_supported,
    swap_linears,
)
from tests.tiny import tiny_engine


@pytest.mark.skipif(not packed_supported(), reason="this torch build has no oneDNN (mkldnn) CPU backend")
@pytest.mark.parametrize("rows", [1, 2, 3, 5, 9])
def test_packed_linear_matches_f_linear(rows):
    torch.manual_seed(0)
    lin = nn.Linear(64, 48)
    x = torch.randn(rows, 64)
    torch.testing.assert_close(PackedLinear(lin)(x), lin(x), atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not int8_supported(), reason="this torch build lacks _weight_int8pack_mm")
def test_int8_linear_is_close_but_not_identical():
    torch.manual_seed(0)
    lin = nn.Linear(64, 48)
    x = torch.randn(4, 64)
    ref, got = lin(x), Int8Linear(lin)(x)
    rel = (got - ref).abs().max() / ref.abs().max()
    assert 0 < rel < 0.05


@pytest.mark.skipif(not (int8_supported() and packed_supported()), reason="needs both CPU fast paths")
def test_fast_paths_keep_greedy_speculation_exact():
    eng = tiny_engine()
    swap_linears(eng.target, PackedLinear)
    swap_linears(eng.draft, Int8Linear)
    ref = tiny_engine(draft=False)
    for content in ["hello there", "def f(x): return x", "abcabcabc"]:
        ids = eng.encode_chat([{"role": "user", "content": content}])
        eng.reset()
        *_, spec = eng.generate(ids, SamplingParams(max_new_tokens=30), SpecParams(k=4))
        *_, plain = ref.generate(ids, SamplingParams(max_new_tokens=30), SpecParams(enabled=False))
        assert spec.token_ids == plain.token_ids
        assert spec.accepted > 0
