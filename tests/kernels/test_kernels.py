"""The quantized linear kernels: accuracy against float64 references, batch invariance (1 row vs 2..16 rows,
bitwise, every block type), identical bits on every instruction set and thread count, and the pure-torch
fallback.

Tolerances are a-priori rounding bounds, not fitted numbers (u = 2^-24, fp32's unit roundoff):
- fp32 activations: each output is 4 interleaved fp32 FMA chains of K/4 terms, then 2 adds, so
  |y - y_exact| <= (K/4 + 2) * u * sum_k |w_k x_k|  (Higham's gamma_n bound, to first order).
- int8 activations: integer block sums are exact; per 32-input block at most 3 float roundings (cvt is exact
  below 2^24, then fma into the block sum, the dmin/offset fma, d * dx) plus 2 per unit, each on partial sums
  bounded by sum_k (|d*sc*q_k| + |dmin*m|) |xq_k dx|. So (3K/32 + 2K/unit + 4) * u times that. The reference
  is the exact product of gguf's weights with the dequantized int8 activations, computed in float64; gguf's
  float32 weights differ from the exact d*sc*q - dmin*m by at most half an ulp, i.e. one more u of the same sum.
Both are checked with a safety factor of 2.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.cpu import ext, formats, kernels_name
from engine.cpu.formats import FORMATS, T
from engine.cpu.linear import FileEmbedding, QuantEmbedding, QuantLinear, packed_slices

try:
    from isa import outputs_per_isa_and_threads
except ImportError:  # tests/ imported as a package
    from tests.isa import outputs_per_isa_and_threads

try:
    from quant_helpers import offsets
    from test_quant_formats import gguf_ref
except ImportError:  # tests/ imported as a package
    from tests.kernels.test_formats import gguf_ref
    from tests.quant_helpers import offsets

U = 2.0 ** -24
QUANT = [t for t in FORMATS if FORMATS[t].quantized]
MODES = [(t, "int8") for t in QUANT] + [(t, "fp32") for t in FORMATS]
N, K = 52, 512  # 52 outputs: 6 full groups of 8 and a padded one; 7 groups, so AVX-512 pairs leave one alone


def mode_id(p) -> str:
    return f"{p[0].name}-{p[1]}"


def rows_and_references(qt, n: int, k: int, seed: int) -> tuple[np.ndarray, torch.Tensor, torch.Tensor]:
    """Random valid GGUF rows (n, k) of type qt, their gguf weights and their offsets (see quant_helpers), float64."""
    raw = formats.random_rows(qt, n, k, np.random.default_rng(seed))
    return raw, torch.from_numpy(gguf_ref(raw, qt)).double(), torch.from_numpy(offsets(raw, qt)).double()


@pytest.fixture(scope="module")
def cases():
    """{qtype: (raw rows, gguf weights (N, K) float64, offsets (N, K) float64, bias)}"""
    bias = {qt: torch.randn(N, generator=torch.Generator().manual_seed(int(qt))) for qt in FORMATS}
    return {qt: (*rows_and_references(qt, N, K, 7 + int(qt)), bias[qt]) for qt in FORMATS}


def activations(rows: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, K, generator=g)
    x[:, 100:132] *= 20  # an outlier block, as real activations have
    x[0, 200:232] = 0  # an all-zero block (scale 0)
    return x


def int8_activations(x: torch.Tensor) -> torch.Tensor:
    """The kernels' activation rounding, dequantized: per 32 inputs, dx = amax/127, q = round-half-even(x * 127/amax)."""
    xb = x.reshape(x.shape[0], -1, 32)
    amax = xb.abs().amax(-1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))  # float32, as in C++
    q = torch.round(xb * inv)
    return (q.double() * (amax / 127.0).double()).reshape(x.shape)


def layer(case, qtype, act, bias=True) -> QuantLinear:
    raw, *_, b = case
    return QuantLinear(raw, qtype, K, bias=b if bias else None, act=act)


@pytest.mark.parametrize("mode", MODES, ids=mode_id)
def test_kernel_matches_float64_reference_within_rounding_bound(kernels, cases, mode):
    qtype, act = mode
    raw, w, off, b = cases[qtype]
    x = activations(16)
    y = layer(cases[qtype], qtype, act)(x).double()
    if act == "fp32":
        xr = x.double()
        ref, mag = xr @ w.T + b.double(), xr.abs() @ w.abs().T
        bound = (K / 4 + 2) * U * mag
    else:
        xr = int8_activations(x)
        ref = xr @ w.T + b.double()
        mag = xr.abs() @ (w + off).abs().T + xr.abs() @ off.abs().T  # |d*sc*q| + |dmin*m| per weight
        bound = (3 * K / 32 + 2 * K / FORMATS[qtype].unit_k + 5) * U * mag
    err = (y - ref).abs()
    assert (err <= 2 * bound + 1e-30).all(), f"max error / bound = {(err / (bound + 1e-30)).max():.2f}"


@pytest.mark.parametrize("qtype", QUANT, ids=lambda t: t.name)
def test_int8_activation_cost_is_small(kernels, cases, qtype):
    """Against exact fp32 activations the int8 rounding costs well under 1% of the output scale."""
    raw, w, *_ = cases[qtype]
    x = activations(8)
    lin = layer(cases[qtype], qtype, "int8", bias=False)
    exact = x.double() @ w.T
    rel = (lin(x).double() - exact).norm() / exact.norm()
    assert rel < 1e-2


@pytest.mark.parametrize("qtype", list(FORMATS), ids=lambda t: t.name)
def test_fp32_path_computes_with_gguf_weights_exactly(kernels, cases, qtype):
    """One-hot inputs read the weights back through the whole fp32 kernel: they are gguf's values."""
    raw, w, *_ = cases[qtype]
    lin = layer(cases[qtype], qtype, "fp32", bias=False)
    eye = torch.eye(K)
    cols = torch.cat([lin(eye[i:i + 16]) for i in range(0, K, 16)])  # (K, N) = W^T
    assert torch.equal(cols.T.double(), w)


@pytest.mark.parametrize("mode", MODES, ids=mode_id)
def test_batch_invariance_bitwise(kernels, cases, mode):
    """A row's output is bitwise the same alone, in every batch of 2..16 rows, and past 16 rows."""
    qtype, act = mode
    lin = layer(cases[qtype], qtype, act)
    x = activations(20, seed=1)
    alone = torch.cat([lin(x[i:i + 1]) for i in range(20)])
    for rows in range(2, 17):
        assert torch.equal(lin(x[:rows]), alone[:rows]), f"{rows} rows"
    assert torch.equal(lin(x[3:12]), alone[3:12])
    assert torch.equal(lin(x), alone)  # 20 rows: run as 16 + 4
    assert torch.equal(lin(x.reshape(4, 5, K)).reshape(20, N), alone)


@pytest.mark.parametrize("mode", MODES, ids=mode_id)
def test_same_bits_on_every_isa_and_thread_count(kernels, cases, mode):
    """Scalar, AVX2 and AVX-512 VNNI (where this CPU has them), 1 or 2 threads: identical outputs, for passes that
    each instruction set runs as one tile of rows or as several (16 rows: 8 + 8 on the 256-bit builds)."""
    qtype, act = mode
    lin = layer(cases[qtype], qtype, act)
    x = activations(16, seed=2)
    outs = outputs_per_isa_and_threads(lambda: torch.cat([lin(x[:rows]) for rows in (1, 2, 5, 7, 9, 16)]))
    first = next(iter(outs.values()))
    assert all(torch.equal(first, y) for y in outs.values()), list(outs)


@pytest.mark.parametrize("qtype", [q for q in FORMATS if FORMATS[q].quantized])
def test_tile_choice_keeps_the_bits(kernels, cases, qtype):
    """The AVX-512 kernels pair groups from some row count on (engine/cpu/tune.py picks it per machine): paired
    from 2 rows, by default, or never, every row count gives the same bits."""
    if "avx512vnni" not in kernels.supported_isas():
        pytest.skip("this CPU has no AVX-512 VNNI: there is no tile to choose")
    lin = layer(cases[qtype], qtype, "int8")
    x = activations(16, seed=3)
    before, isa = kernels.pair_from(), kernels.isa()
    kernels.set_isa("avx512vnni")
    try:
        outs = {}
        for setting in (0, 2, 17):
            kernels.set_pair_from(setting)
            outs[setting] = [lin(x[:r]) for r in range(1, 17)]
        for r in range(16):
            assert torch.equal(outs[0][r], outs[2][r]) and torch.equal(outs[0][r], outs[17][r]), f"{r + 1} rows"
    finally:
        kernels.set_pair_from(before)
        kernels.set_isa(isa)


@pytest.mark.parametrize("qtype", [q for q in FORMATS if FORMATS[q].quantized])
def test_stream_prefetch_keeps_the_bits(kernels, cases, qtype):
    """Calls over 1-6 rows ask for their weights ahead or leave them to the hardware prefetcher (engine/cpu/tune.py
    picks per machine): a prefetch moves no data into a result, so every row count gives the same bits either way."""
    lin = layer(cases[qtype], qtype, "int8")
    x = activations(16, seed=4)
    before = kernels.stream_prefetch()
    try:
        outs = {}
        for setting in (0, 1):
            kernels.set_stream_prefetch(setting)
            outs[setting] = outputs_per_isa_and_threads(lambda: torch.cat([lin(x[:r]) for r in (1, 2, 3, 6, 7)]))
        for key, y in outs[0].items():
            assert torch.equal(y, outs[1][key]), key
    finally:
        kernels.set_stream_prefetch(before)
    with pytest.raises(ValueError, match="stream_prefetch"):
        kernels.set_stream_prefetch(2)


def test_concat_and_tied_embedding(kernels, cases):
    raw, w, *_ = cases[T.Q4_K]
    a = QuantLinear(raw[:16], T.Q4_K, K)
    b = QuantLinear(raw[16:], T.Q4_K, K, bias=torch.ones(N - 16))
    fused = QuantLinear.concat([a, b])
    x = activations(5, seed=3)
    assert torch.equal(fused(x), torch.cat([a(x), b(x)], dim=1))
    emb = QuantEmbedding.tied(fused)
    assert emb.table.packed.data_ptr() == fused.packed.data_ptr()
    assert torch.equal(emb(torch.tensor([0, 43])).double(), w[[0, 43]])


def test_parts_repacked_into_one_buffer_concat_without_a_copy(kernels, cases):
    raw, *_ = cases[T.Q6_K]
    slices = packed_slices([(T.Q6_K, 16, K), (T.Q6_K, N - 16, K)])
    a = QuantLinear(raw[:16], T.Q6_K, K, out=slices[0])
    b = QuantLinear(raw[16:], T.Q6_K, K, out=slices[1])
    fused = QuantLinear.concat([a, b])
    assert fused.packed.data_ptr() == a.packed.data_ptr() and fused.packed.numel() == a.nbytes + b.nbytes
    assert torch.equal(fused.packed, QuantLinear.concat([QuantLinear(raw[:16], T.Q6_K, K),
                                                         QuantLinear(raw[16:], T.Q6_K, K)]).packed)
    with pytest.raises(ValueError, match="out:"):
        QuantLinear(raw[:16], T.Q6_K, K, out=slices[1])


def test_one_isa_table_names_the_instruction_sets(kernels):
    """The C++ table (csrc/isa.cpp) is where the names live: what runs, what this CPU runs, what the user reads."""
    table = dict(kernels.isa_table())
    assert list(table)[0] == "scalar" and set(kernels.supported_isas()) <= set(table)
    assert kernels.isa() == kernels.supported_isas()[-1]  # the best one, unless SPECLENS_QUANT_ISA pins another
    assert kernels_name() == f"{table[kernels.isa()]} kernels"


def test_bad_shapes_are_refused(kernels, cases):
    raw, *_ = cases[T.Q6_K]
    with pytest.raises(formats.UnsupportedType, match="multiples of 256"):
        QuantLinear(raw, T.Q6_K, 500)
    lin = QuantLinear(raw, T.Q6_K, K)
    with pytest.raises(ValueError, match=r"x: \(\.\.\., 512\)"):
        lin(torch.randn(2, K + 32))
    with pytest.raises(IndexError):
        QuantEmbedding.tied(lin)(torch.tensor([0, N]))
    with pytest.raises(ValueError, match="unknown instruction set"):
        kernels.set_isa("sse9")
    with pytest.raises(formats.UnsupportedType, match="Q2_K"):
        QuantLinear(raw, T.Q2_K, K)
    with pytest.raises(ValueError, match="rows of 420 bytes"):  # repack reads a buffer, checked against its size
        kernels.repack(raw.reshape(-1)[:-10], T.Q6_K, N, K, None, 1)
    with pytest.raises(ValueError, match="C-contiguous"):
        kernels.repack(raw[:, ::2], T.Q6_K, N, K // 2, None, 1)


# --- without the extension ---------------------------------------------------------------------------------

@pytest.fixture
def no_kernels(monkeypatch):
    monkeypatch.setattr(ext, "load", lambda: None)


@pytest.mark.parametrize("qtype", list(FORMATS), ids=lambda t: t.name)
def test_fallback_agrees_and_is_batch_invariant(no_kernels, cases, qtype):
    raw, w, _, b = cases[qtype]
    lin = QuantLinear(raw, qtype, K, bias=b)
    assert lin.packed is None
    x = activations(9, seed=4)
    y = lin(x)
    ref = x.double() @ w.T + b.double()
    # torch.mv's summation order is its own; the same first-order bound with K terms
    assert ((y.double() - ref).abs() <= 2 * (K + 2) * U * (x.double().abs() @ w.abs().T)).all()
    assert all(torch.equal(lin(x[:r]), y[:r]) for r in (1, 2, 5))
    assert torch.equal(lin.dequantize().double(), w)
    assert torch.equal(QuantEmbedding(raw, qtype, K)(torch.tensor([2, 7])).double(), w[[2, 7]])


@pytest.mark.parametrize("qtype", list(FORMATS), ids=lambda t: t.name)
def test_file_embedding_reads_the_same_rows(kernels, cases, qtype):
    raw, w, *_ = cases[qtype]
    ids = torch.tensor([[3, 0], [N - 1, 3]])
    emb = FileEmbedding(raw, qtype, K)
    assert torch.equal(emb(ids), QuantEmbedding(raw, qtype, K)(ids)) and torch.equal(emb(ids[0]).double(), w[[3, 0]])
    with pytest.raises(IndexError, match="out of range"):
        emb(torch.tensor([N]))
