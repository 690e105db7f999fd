"""The GGML block types the kernels run, their byte layouts, and valid random blocks (tests, benchmarks).

A GGUF tensor of shape (N, K) (N output features, K inputs) is N rows of K / block blocks. Per block:

| type | inputs | bytes | layout | weight |
| --- | ---: | ---: | --- | --- |
| Q4_K | 256 | 144 | d f16, dmin f16, scales[12] (8 six-bit scale/min pairs), qs[128] (4-bit) | d*sc_j*q - dmin*m_j |
| Q5_K | 256 | 176 | as Q4_K, then qh[32] (5th bits) before qs | d*sc_j*q - dmin*m_j |
| Q6_K | 256 | 210 | ql[128] (low 4 bits), qh[64] (high 2 bits), scales[16] int8, d f16 | d*sc_j*(q - 32) |
| Q8_0 | 32 | 34 | d f16, qs[32] int8 | d*q |
| Q5_0 | 32 | 22 | d f16, qh u32 (5th bits), qs[16] (4-bit) | d*(q - 16) |
| Q4_0 | 32 | 18 | d f16, qs[16] (4-bit) | d*(q - 8) |
| F16 / BF16 / F32 | 1 | 2 / 2 / 4 | the value | |

Sub-blocks j are 32 inputs for Q4_K/Q5_K and 16 for Q6_K. The weights are `gguf.quants.dequantize`'s: the
C++ kernels' exact path and `QuantLinear.dequantize` equal it bit for bit (tests/kernels/test_formats.py).
The packed units' sizes below are the C++ structs' (csrc/quant.h), which tests/kernels/test_formats.py checks.
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
    unit_bytes: int  # bytes per packed unit of GROUP output features (csrc/quant.h's Unit structs)

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
        return self.qtype not in (T.F16, T.BF16, T.F32)


FORMATS = {f.qtype: f for f in (
    Format(T.Q4_K, 256, 1184), Format(T.Q5_K, 256, 1440), Format(T.Q6_K, 256, 1680),
    Format(T.Q8_0, 32, 272), Format(T.Q5_0, 32, 176), Format(T.Q4_0, 32, 144), Format(T.F16, 32, 512),
    Format(T.BF16, 32, 512), Format(T.F32, 32, 1024),
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


# --- valid random blocks (tests, benchmarks) ------------------------------------------------------------

_F16_FIELDS = {T.Q4_K: (0, 2), T.Q5_K: (0, 2), T.Q6_K: (208,), T.Q8_0: (0,), T.Q5_0: (0,), T.Q4_0: (0,)}


def random_rows(qtype: int, n: int, k: int, rng: np.random.Generator, scale: float = 0.02) -> np.ndarray:
    """(n, row_bytes) uint8 of random blocks whose f16 fields are finite (random bytes elsewhere)."""
    f = fmt(qtype)
    nb = n * k // f.block
    if f.qtype == T.F32:
        return rng.standard_normal((n, k), dtype=np.float32).view(np.uint8)
    if f.qtype == T.F16:
        return rng.standard_normal((n, k)).astype(np.float16).view(np.uint8)
    if f.qtype == T.BF16:  # fp32's upper halves: every bf16 value is finite here
        return (rng.standard_normal((n, k), dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    blocks = rng.integers(0, 256, (nb, f.block_bytes), dtype=np.uint8)
    for off in _F16_FIELDS[f.qtype]:
        # signed scales spanning a few binades (and the occasional zero): d, dmin as real files have them
        v = (rng.standard_normal(nb) * scale * 2.0 ** rng.integers(-4, 2, nb)).astype(np.float16)
        v[rng.random(nb) < 0.01] = 0
        blocks[:, off:off + 2] = v.view(np.uint8).reshape(nb, 2)
    return blocks.reshape(n, -1)
