"""GGML block formats: the weights the kernels compute with equal gguf.quants.dequantize bit for bit, on random
blocks of every supported type and on real blocks of the embedded Qwen2.5-Coder GGUFs (when provisioned); the
Python table of unit sizes is the compiled one.

"Bit for bit" compares the float32 bit patterns, so even -0.0 vs +0.0 would fail.
"""
from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType
from gguf.quants import dequantize as gguf_dequantize

from engine.cpu import formats
from engine.cpu.formats import FORMATS, T
from engine.cpu.linear import QuantEmbedding, QuantLinear
from engine.io import provision

try:
    from quant_helpers import embedding_from_gguf, kquant_parts, linear_from_gguf
except ImportError:  # tests/ imported as a package
    from tests.quant_helpers import embedding_from_gguf, kquant_parts, linear_from_gguf

TYPES = list(FORMATS)


def gguf_ref(raw: np.ndarray, qtype: int) -> np.ndarray:
    """gguf's dequantization of (N, row_bytes) rows, as (N, K) float32."""
    return np.asarray(gguf_dequantize(np.ascontiguousarray(raw), GGMLQuantizationType(qtype)), np.float32).reshape(raw.shape[0], -1)


def same_bits(a, b) -> bool:
    a, b = np.ascontiguousarray(np.asarray(a, np.float32)), np.ascontiguousarray(np.asarray(b, np.float32))
    return a.shape == b.shape and np.array_equal(a.view(np.uint32), b.view(np.uint32))


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_format_sizes_match_gguf(qtype):
    f = FORMATS[qtype]
    assert (f.block, f.block_bytes) == GGML_QUANT_SIZES[qtype]
    assert f.unit_k % f.block == 0 and f.unit_bytes % 16 == 0
    # what the kernels keep is the file's bits per weight (K-quants: +1/8 for byte-wide 6-bit scales)
    assert f.bits_per_weight <= f.packed_bits_per_weight <= f.bits_per_weight + 0.125


def test_format_sizes_are_the_compiled_units(kernels):
    """formats.FORMATS restates csrc/quant.h's unit structs for Python (sizes without building the kernels)."""
    for qtype, f in FORMATS.items():
        assert kernels.layout(qtype) == (f.unit_k, f.unit_bytes, f.block, f.block_bytes), qtype.name
    with pytest.raises(ValueError, match="unsupported ggml type"):
        kernels.layout(T.Q2_K)


@pytest.mark.parametrize("qtype", TYPES, ids=lambda t: t.name)
def test_layer_weights_equal_gguf_on_random_blocks(kernels, qtype):
    """What QuantLinear computes with (its packed blocks, decoded) is gguf's weight, including padded
    groups (N not a multiple of 8) and a row permutation (llama Q/K un-permuting)."""
    rng = np.random.default_rng(100 + int(qtype))
    raw = formats.random_rows(qtype, 21, 512, rng)
    ref = gguf_ref(raw, qtype)
    assert same_bits(QuantLinear(raw, qtype, 512).dequantize(), ref)
    rows = rng.permutation(21)
    assert same_bits(QuantLinear(raw, qtype, 512, rows=rows).dequantize(), ref[rows])
    ids = torch.tensor([[3, 0], [20, 3]])
    assert same_bits(QuantEmbedding(raw, qtype, 512)(ids).reshape(4, 512), ref[[3, 0, 20, 3]])


def test_special_fp16_scales_dequantize_like_gguf(kernels):
    """Subnormal, zero and negative-zero scales take the same path through our f16 conversion as numpy's."""
    raw = formats.random_rows(T.Q8_0, 8, 64, np.random.default_rng(5))
    specials = np.array([1e-7, -3e-8, 0.0, -0.0, 6e-5, -65504.0, 65504.0, 2 ** -24], dtype=np.float16)
    for i, v in enumerate(specials):
        raw[i, 0:2] = np.frombuffer(v.tobytes(), np.uint8)
        raw[i, 34:36] = np.frombuffer(specials[-1 - i].tobytes(), np.uint8)
    assert same_bits(QuantLinear(raw, T.Q8_0, 64).dequantize(), gguf_ref(raw, T.Q8_0))


# --- real blocks ------------------------------------------------------------------------------------------

def _tensor_index(path: Path) -> dict[str, tuple[int, tuple[int, ...], int]]:
    """{name: (ggml type, GGUF dims, absolute data offset)} from a GGUF header. Only skims the metadata: the
    gguf package's reader takes 10-25 s here to build views of the 300k tokenizer strings."""
    with open(path, "rb") as f:
        buf = f.read(32 << 20)  # the header of these files is ~6 MB (tokenizer strings)
    pos = 8
    n_tensors, n_kv = struct.unpack_from("<QQ", buf, pos)
    pos += 16
    sizes = {GGUFValueType.UINT8: 1, GGUFValueType.INT8: 1, GGUFValueType.UINT16: 2, GGUFValueType.INT16: 2,
             GGUFValueType.UINT32: 4, GGUFValueType.INT32: 4, GGUFValueType.FLOAT32: 4, GGUFValueType.BOOL: 1,
             GGUFValueType.UINT64: 8, GGUFValueType.INT64: 8, GGUFValueType.FLOAT64: 8}
    align = 32

    def skip(vtype: int, pos: int) -> int:
        if vtype == GGUFValueType.STRING:
            return pos + 8 + struct.unpack_from("<Q", buf, pos)[0]
        if vtype == GGUFValueType.ARRAY:
            sub, count = struct.unpack_from("<IQ", buf, pos)
            pos += 12
            if sub in sizes:
                return pos + count * sizes[GGUFValueType(sub)]
            for _ in range(count):
                pos = skip(sub, pos)
            return pos
        return pos + sizes[GGUFValueType(vtype)]

    for _ in range(n_kv):
        klen = struct.unpack_from("<Q", buf, pos)[0]
        key = buf[pos + 8:pos + 8 + klen].decode()
        vtype = struct.unpack_from("<I", buf, pos + 8 + klen)[0]
        pos = pos + 12 + klen
        if key == "general.alignment":
            align = struct.unpack_from("<I", buf, pos)[0]
        pos = skip(vtype, pos)
    infos = []
    for _ in range(n_tensors):
        nlen = struct.unpack_from("<Q", buf, pos)[0]
        name = buf[pos + 8:pos + 8 + nlen].decode()
        pos += 8 + nlen
        nd = struct.unpack_from("<I", buf, pos)[0]
        dims = struct.unpack_from(f"<{nd}Q", buf, pos + 4)
        qtype, off = struct.unpack_from("<IQ", buf, pos + 4 + 8 * nd)
        pos += 4 + 8 * nd + 12
        infos.append((name, qtype, dims, off))
    start = -(-pos // align) * align
    return {name: (qtype, dims, start + off) for name, qtype, dims, off in infos}


def _embedded_ggufs() -> list[Path]:
    found = []
    for ps in (provision.TARGET, provision.DRAFT):
        p = provision.cache_root() / f"{ps.name}.gguf"
        if p.is_file() and p.stat().st_size == ps.size:
            found.append(p)
    return found


@pytest.fixture(scope="module")
def real_tensors():
    """Up to two tensors per ggml type from the embedded GGUFs, as (name, type, K, first 48 rows)."""
    files = _embedded_ggufs()
    if not files:
        pytest.skip(f"the embedded GGUFs are not provisioned under {provision.cache_root()} "
                    "(install speclens[default-models] and run the app or speclens-bench once)")
    picked: dict[int, list] = {}
    for path in files:
        mm = np.memmap(path, dtype=np.uint8, mode="r")
        for name, (qtype, dims, off) in _tensor_index(path).items():
            if qtype not in FORMATS or len(picked.setdefault(qtype, [])) >= 2:
                continue
            k = dims[0]
            n = min(48, int(np.prod(dims[1:], dtype=np.int64)) if len(dims) > 1 else 1)
            rb = formats.row_bytes(qtype, k)
            picked[qtype].append((f"{path.name}:{name}", qtype, k, mm[off:off + n * rb].reshape(n, rb)))
    return [t for ts in picked.values() for t in ts]


def test_real_blocks_cover_the_embedded_types(real_tensors):
    assert {T(q) for _, q, _, _ in real_tensors} >= {T.Q4_K, T.Q6_K, T.F32} | (
        {T.Q8_0, T.Q5_0} if any("0.5b" in n for n, *_ in real_tensors) else set())


def test_real_blocks_dequantize_like_gguf(real_tensors, kernels):
    for name, qtype, k, raw in real_tensors:
        assert same_bits(QuantLinear(raw, qtype, k).dequantize(), gguf_ref(raw, qtype)), name


def test_real_kquant_weights_are_exact_in_float32(real_tensors):
    """The int8 path multiplies with d*sc*q and dmin*m as exact integers-times-scales, i.e. with the real value
    d*sc*q - dmin*m, while gguf rounds that difference to float32. On the embedded files the difference is
    always exact, so both paths compute with the same weights."""
    for name, qtype, k, raw in real_tensors:
        if qtype not in (T.Q4_K, T.Q5_K):
            continue
        dq, m = kquant_parts(qtype, np.ascontiguousarray(raw).reshape(-1, FORMATS[qtype].block_bytes))
        assert np.array_equal((dq - m).astype(np.float64), dq.astype(np.float64) - m.astype(np.float64)), name


def test_layers_from_a_gguf_reader_tensor(kernels, tmp_path):
    """Layers take gguf.GGUFReader tensors as they come (GGUF shape order, memory-mapped data, F32 data as floats)
    and compute with gguf's weights."""
    import gguf

    rng = np.random.default_rng(3)
    w8 = rng.standard_normal((40, 64)).astype(np.float32)
    w32 = rng.standard_normal((24, 32)).astype(np.float32)
    writer = gguf.GGUFWriter(str(tmp_path / "t.gguf"), "llama")
    q8 = gguf.quants.quantize(w8, GGMLQuantizationType.Q8_0)
    writer.add_tensor("q8", q8, raw_shape=q8.shape, raw_dtype=GGMLQuantizationType.Q8_0)
    writer.add_tensor("f32", w32)
    writer.write_header_to_file(), writer.write_kv_data_to_file(), writer.write_tensors_to_file()
    writer.close()
    tensors = {t.name: t for t in gguf.GGUFReader(str(tmp_path / "t.gguf")).tensors}
    lin = linear_from_gguf(tensors["q8"])
    assert (lin.in_features, lin.out_features) == (64, 40)
    assert same_bits(lin.dequantize(), gguf_ref(np.asarray(tensors["q8"].data), GGMLQuantizationType.Q8_0))
    assert same_bits(linear_from_gguf(tensors["f32"]).dequantize(), w32)
    assert same_bits(embedding_from_gguf(tensors["f32"])(torch.tensor([5])), w32[[5]])

