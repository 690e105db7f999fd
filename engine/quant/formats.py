"""The GGML block types the kernels run, their byte layouts, and a numpy reference dequantizer.

A GGUF tensor of shape (N, K) (N output features, K inputs) is N rows of K / block blocks. Per block:

| type | inputs | bytes | layout | weight |
| --- | ---: | ---: | --- | --- |
| Q4_K | 256 | 144 | d f16, dmin f16, scales[12] (8 six-bit scale/min pairs), qs[128] (4-bit) | d*sc_j*q - dmin*m_j |
| Q5_K | 256 | 176 | as Q4_K, then qh[32] (5th bits) before qs | d*sc_j*q - dmin*m_j |
| Q6_K | 256 | 210 | ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] int8, d f16 | d*sc_j*(q - 32) |
| Q8_0 | 32 | 34 | d f16, qs[32] int8 | d*q |
| Q5_0 | 32 | 22 | d f16, qh u32 (5th bits), qs[16] (4-bit) | d*(q - 16) |
| F16 / F32 | 1 | 2 / 4 | the value | |

Sub-blocks j are 32 inputs for Q4_K/Q5_K and 16 for Q6_K. `dequantize` computes every weight with the
same float32 operations, in the same order, as `gguf.quants.dequantize`, so the two agree bit for bit
(tests/test_quant_formats.py); the C++ kernels' exact path and `QuantLinear.dequantize` do too.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

T = GGMLQuantizationType
GROUP = 8  # output features per packed group (csrc/quant.h)


class UnsupportedType(ValueError):
    """A GGML type the kernels do not run."""


@dataclass(frozen=True)
class Format:
    qtype: GGMLQuantizationType
    unit_k: int  # inputs per packed unit
    unit_bytes: int  # bytes per packed unit of GROUP output features

    @property
    def block(self) -> int:
        return GGML_QUANT_SIZES[self.qtype][0]

    @property
    def block_bytes(self) -> int:
        return GGML_QUANT_SIZES[self.qtype][1]

    @property
    def bits_per_weight(self) -> float:  # in the file
        return 8 * self.block_bytes / self.block

    @property
    def packed_bits_per_weight(self) -> float:  # as the kernels keep it
        return 8 * self.unit_bytes / (self.unit_k * GROUP)

    @property
    def quantized(self) -> bool:
        return self.qtype not in (T.F16, T.F32)


FORMATS = {f.qtype: f for f in (
    Format(T.Q4_K, 256, 1184), Format(T.Q5_K, 256, 1440), Format(T.Q6_K, 256, 1680),
    Format(T.Q8_0, 32, 272), Format(T.Q5_0, 32, 176), Format(T.F16, 32, 512), Format(T.F32, 32, 1024),
)}


def fmt(qtype: int) -> Format:
    try:
        return FORMATS[T(qtype)]
    except (KeyError, ValueError):
        name = T(qtype).name if qtype in T._value2member_map_ else str(qtype)
        raise UnsupportedType(f"ggml type {name} is not supported by the quantized kernels "
                              f"(supported: {', '.join(t.name for t in FORMATS)})") from None


def row_bytes(qtype: int, k: int) -> int:
    f = fmt(qtype)
    if k % f.unit_k:
        raise UnsupportedType(f"{f.qtype.name} needs input features in multiples of {f.unit_k}, got {k}")
    return k // f.block * f.block_bytes


def packed_bytes(qtype: int, n: int, k: int) -> int:
    f = fmt(qtype)
    return -(-n // GROUP) * (k // f.unit_k) * f.unit_bytes


# --- reference dequantizer ---------------------------------------------------------------------------

def _f16(b: np.ndarray) -> np.ndarray:  # (n, 2) uint8 -> (n, 1) float32
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray, chunk: int) -> np.ndarray:
    """(n, B) bytes in chunks of `chunk` -> (n, 2B): each chunk's low nibbles, then its high nibbles."""
    n = qs.shape[0]
    q = qs.reshape(n, -1, 1, chunk) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
    return (q & 15).reshape(n, -1)


def _kquant_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """12 bytes -> 8 six-bit scales and 8 six-bit mins: the first 4 of each sit in the low 6 bits of
    bytes 0-3 / 4-7; the last 4 take their low 4 bits from bytes 8-11 and their top 2 from bits 6-7."""
    a, b, c = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    sc = np.concatenate([a & 63, (c & 15) | ((a >> 6) << 4)], axis=1)
    mn = np.concatenate([b & 63, (c >> 4) | ((b >> 6) << 4)], axis=1)
    return sc, mn


def _kquant(qtype: T, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K/Q5_K blocks (n, bytes) -> (D * q, M), each (n, 8, 32) float32: the weight is D * q - M."""
    n = blocks.shape[0]
    d, dmin = _f16(blocks[:, 0:2]), _f16(blocks[:, 2:4])
    sc, mn = _kquant_scales(blocks[:, 4:16])
    q = _nibbles(blocks[:, -128:], 32).reshape(n, 8, 32)  # (n, sub-block, 32)
    if qtype == T.Q5_K:
        bit = np.arange(8, dtype=np.uint8).reshape(1, 8, 1)
        q = q | (((blocks[:, 16:48].reshape(n, 1, 32) >> bit) & 1) << 4)
    D = (d * sc.astype(np.float32)).reshape(n, 8, 1)
    M = (dmin * mn.astype(np.float32)).reshape(n, 8, 1)
    return D * q.astype(np.float32), np.broadcast_to(M, (n, 8, 32))


def _blocks(qtype: T, blocks: np.ndarray) -> np.ndarray:
    """(n, block_bytes) uint8 -> (n, block) float32."""
    n = blocks.shape[0]
    if qtype in (T.Q4_K, T.Q5_K):
        dq, m = _kquant(qtype, blocks)
        return (dq - m).reshape(n, 256)
    if qtype == T.Q6_K:
        lo = _nibbles(blocks[:, 0:128], 64)  # (n, 256): 128 per half
        hi = ((blocks[:, 128:192].reshape(n, 2, 1, 32) >> np.array([0, 2, 4, 6], dtype=np.uint8).reshape(1, 1, 4, 1)) & 3)
        q = (lo | (hi.reshape(n, 256) << 4)).astype(np.int8) - np.int8(32)
        D = (_f16(blocks[:, 208:210]) * blocks[:, 192:208].view(np.int8).astype(np.float32)).reshape(n, 16, 1)
        return (D * q.reshape(n, 16, 16).astype(np.float32)).reshape(n, 256)
    if qtype == T.Q8_0:
        return blocks[:, 2:34].view(np.int8).astype(np.float32) * _f16(blocks[:, 0:2])
    if qtype == T.Q5_0:
        qh = np.ascontiguousarray(blocks[:, 2:6]).view(np.uint32)  # (n, 1)
        hi = ((qh >> np.arange(32, dtype=np.uint32)) & 1).astype(np.uint8)
        q = (_nibbles(blocks[:, 6:22], 16) | (hi << 4)).astype(np.int8) - np.int8(16)
        return _f16(blocks[:, 0:2]) * q.astype(np.float32)
    if qtype == T.F16:
        return np.ascontiguousarray(blocks).view(np.float16).astype(np.float32)
    return np.ascontiguousarray(blocks).view(np.float32).copy()


def dequantize(raw: np.ndarray, qtype: int) -> np.ndarray:
    """GGUF rows (N, row_bytes) uint8 -> (N, K) float32 weights."""
    f = fmt(qtype)
    raw = np.asarray(raw, dtype=np.uint8)
    n = raw.shape[0]
    out = _blocks(f.qtype, raw.reshape(-1, f.block_bytes))  # (N * K / block, block)
    return out.reshape(n, -1)


def offsets(raw: np.ndarray, qtype: int) -> np.ndarray:
    """The subtracted part of each weight, (N, K) float32: dmin * m_j for Q4_K/Q5_K, zero for the rest
    (error bounds need |d*sc*q| + |dmin*m|, which can exceed |w|)."""
    f = fmt(qtype)
    raw = np.asarray(raw, dtype=np.uint8)
    if f.qtype not in (T.Q4_K, T.Q5_K):
        return np.zeros((raw.shape[0], raw.shape[1] // f.block_bytes * f.block), dtype=np.float32)
    return np.ascontiguousarray(_kquant(f.qtype, raw.reshape(-1, f.block_bytes))[1]).reshape(raw.shape[0], -1)


# --- valid random blocks (tests, benchmarks) ------------------------------------------------------------

_F16_FIELDS = {T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,), T.Q8_0: (0,), T.Q5_0: (0,)}


def random_rows(qtype: int, n: int, k: int, rng: np.random.Generator, scale: float = 0.02) -> np.ndarray:
    """(n, row_bytes) uint8 of random blocks whose f16 fields are finite (random bytes elsewhere)."""
    f = fmt(qtype)
    nb = n * k // f.block
    if f.qtype == T.F32:
        return rng.standard_normal((n, k), dtype=np.float32).view(np.uint8)
    if f.qtype == T.F16:
        return rng.standard_normal((n, k)).astype(np.float16).view(np.uint8)
    blocks = rng.integers(0, 256, (nb, f.block_bytes), dtype=np.uint8)
    for off in _F16_FIELDS[f.qtype]:
        # signed scales spanning a few binades (and the occasional zero): d, dmin as real files have them
        v = (rng.standard_normal(nb) * scale * 2.0 ** rng.integers(-4, 2, nb)).astype(np.float16)
        v[rng.random(nb) < 0.01] = 0
        blocks[:, off:off + 2] = v.view(np.uint8).reshape(nb, 2)
    return blocks.reshape(n, -1)
