"""The packed layout over a long K (quant.h, Packing): runs of 8 output groups stored slice by slice, so that a pass
over several rows keeps a slice's activations in L1 while the weights stream in order. Every reader of packed units
(the int8 and fp32 kernels on each instruction set, AVX-512's paired groups, `dequant_cols`, the re-quantizer, the
concatenation of parts) must find the same weights there as over a short K. The shape here has a full run and a
partial one of 5 groups (an odd one for the pairs), and a last slice shorter than the others."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.cpu.formats import FORMATS, T
from engine.cpu.linear import QuantLinear

try:
    from isa import outputs_per_isa_and_threads
    from test_quant_kernels import int8_activations, rows_and_references
except ImportError:  # tests/ imported as a package
    from tests.isa import outputs_per_isa_and_threads
    from tests.kernels.test_kernels import int8_activations, rows_and_references

U = 2.0 ** -24
N, K = 100, 2560  # 13 groups: a run of 8 and one of 5; K: 10 units of 256 (or 80 of 32), slices of 2048 + 512
QUANT = [t for t in FORMATS if FORMATS[t].quantized]


@pytest.fixture(scope="module")
def cases():
    return {qt: rows_and_references(qt, N, K, 11 + int(qt)) for qt in FORMATS}


def activations(rows: int, seed: int = 0) -> torch.Tensor:
    x = torch.randn(rows, K, generator=torch.Generator().manual_seed(seed))
    x[:, 2100:2132] *= 20  # an outlier block in the last slice
    return x


def test_long_k_packs_runs_slice_by_slice(kernels):
    unit_k = FORMATS[T.Q4_K].unit_k
    units, groups, slice_ = K // unit_k, -(-N // 8), kernels.SLICE_K // unit_k
    at = {(g, u): kernels.unit_at(int(T.Q4_K), N, K, g, u) for g in range(groups) for u in range(units)}
    assert sorted(at.values()) == list(range(groups * units))  # every unit has its own place
    assert [at[(0, u)] for u in range(slice_)] == list(range(slice_))  # a group's units within a slice: in a row
    assert at[(1, 0)] == slice_ and at[(0, slice_)] == 8 * slice_  # the run's next group, then the next slice
    assert at[(8, 0)] == 8 * units  # the second run begins after the first run's units
    assert at[(9, slice_)] == 8 * units + 5 * slice_ + (units - slice_)  # 5 groups in it; a shorter last slice
    short = {kernels.unit_at(int(T.Q4_K), N, 512, g, u) for g in range(groups) for u in range(2)}
    assert all(kernels.unit_at(int(T.Q4_K), N, 512, g, u) == 2 * g + u for g in range(groups) for u in range(2))
    assert len(short) == 2 * groups
    with pytest.raises(ValueError, match="unit_at"):
        kernels.unit_at(int(T.Q4_K), N, K, groups, 0)


@pytest.mark.parametrize("qtype", list(FORMATS), ids=lambda t: t.name)
def test_long_k_weights_read_back_exactly(kernels, cases, qtype):
    """`dequant_cols` and the fp32 kernel (one-hot inputs) find gguf's weights where the repacker put them."""
    raw, w, _ = cases[qtype]
    lin = QuantLinear(raw, qtype, K, act="fp32")
    assert torch.equal(lin.dequantize().double(), w)
    eye = torch.eye(K)
    cols = torch.cat([lin(eye[i:i + 16]) for i in (0, 2040, K - 16)])  # the first slice, across the cut, the last
    assert torch.equal(cols.T.double(), w[:, list(range(16)) + list(range(2040, 2056)) + list(range(K - 16, K))])


@pytest.mark.parametrize("qtype", QUANT, ids=lambda t: t.name)
def test_long_k_int8_kernel_within_rounding_bound(kernels, cases, qtype):
    """The a-priori bound of tests/kernels/test_kernels.py, here over runs and slices."""
    raw, w, off = cases[qtype]
    x = activations(9)
    y = QuantLinear(raw, qtype, K, act="int8")(x).double()
    xr = int8_activations(x)
    mag = xr.abs() @ (w + off).abs().T + xr.abs() @ off.abs().T
    bound = (3 * K / 32 + 2 * K / FORMATS[qtype].unit_k + 5) * U * mag
    err = (y - xr @ w.T).abs()
    assert (err <= 2 * bound + 1e-30).all(), f"max error / bound = {(err / (bound + 1e-30)).max():.2f}"


@pytest.mark.parametrize("qtype", QUANT, ids=lambda t: t.name)
def test_long_k_same_bits_everywhere(kernels, cases, qtype):
    """Every instruction set and thread count, AVX-512's paired groups on or off, and one row alone or in a pass of
    2-16: the same bits."""
    raw, *_ = cases[qtype]
    lin = QuantLinear(raw, qtype, K, act="int8")
    x = activations(16, seed=1)
    alone = torch.cat([lin(x[i:i + 1]) for i in range(16)])
    pairs = (0, 17) if "avx512vnni" in kernels.supported_isas() else (kernels.pair_from(),)
    before = kernels.pair_from()
    try:
        for setting in pairs:
            kernels.set_pair_from(setting)
            outs = outputs_per_isa_and_threads(lambda: torch.cat([lin(x[:rows]) for rows in (1, 2, 5, 9, 16)]))
            for key, y in outs.items():
                assert torch.equal(y, torch.cat([alone[:rows] for rows in (1, 2, 5, 9, 16)])), (setting, key)
    finally:
        kernels.set_pair_from(before)


@pytest.mark.parametrize("qtype", [T.Q4_K, T.Q6_K, T.Q8_0], ids=lambda t: t.name)
def test_long_k_requantized_the_same_on_every_isa(kernels, cases, qtype):
    """The re-quantizer reads the source's layout and writes Q4_0's (80 units of 32 over this K, sliced too)."""
    raw, *_ = cases[qtype]
    lin = QuantLinear(raw, qtype, K)
    outs = outputs_per_isa_and_threads(lambda: lin.requantized(int(T.Q4_0)).packed.clone())
    first = next(iter(outs.values()))
    assert all(torch.equal(first, p) for p in outs.values()), list(outs)
    # each block of 32 is re-quantized on its own: the same as the two halves of K, each short enough to be unsliced
    cut = 2048 // FORMATS[qtype].block * FORMATS[qtype].block_bytes
    halves = [QuantLinear(np.ascontiguousarray(part), qtype, k).requantized(int(T.Q4_0)).dequantize()
              for part, k in ((raw[:, :cut], 2048), (raw[:, cut:], K - 2048))]
    assert torch.equal(lin.requantized(int(T.Q4_0)).dequantize(), torch.cat(halves, dim=1))


def test_long_k_concat_keeps_whole_runs(kernels, cases):
    raw, *_ = cases[T.Q4_K]
    a, b = QuantLinear(raw[:64], T.Q4_K, K), QuantLinear(raw[64:], T.Q4_K, K)
    x = activations(5, seed=2)
    assert torch.equal(QuantLinear.concat([a, b])(x), torch.cat([a(x), b(x)], dim=1))
    with pytest.raises(ValueError, match="multiples of 64"):
        QuantLinear.concat([QuantLinear(raw[:16], T.Q4_K, K), QuantLinear(raw[16:], T.Q4_K, K)])
