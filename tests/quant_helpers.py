"""Test-only views of GGML blocks: the two parts of a K-quant weight, and quantized layers from gguf reader tensors."""
from __future__ import annotations

import numpy as np
import torch

from engine.cpu.formats import FORMATS, T
from engine.cpu.linear import Act, QuantEmbedding, QuantLinear


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


def kquant_parts(qtype: int, blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
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


def offsets(raw: np.ndarray, qtype: int) -> np.ndarray:
    """The subtracted part of each weight, (N, K) float32: dmin * m_j for Q4_K/Q5_K, zero for the rest
    (error bounds need |d*sc*q| + |dmin*m|, which can exceed |w|)."""
    f = FORMATS[T(qtype)]
    raw = np.asarray(raw, dtype=np.uint8)
    if f.qtype not in (T.Q4_K, T.Q5_K):
        return np.zeros((raw.shape[0], raw.shape[1] // f.block_bytes * f.block), dtype=np.float32)
    return np.ascontiguousarray(kquant_parts(f.qtype, raw.reshape(-1, f.block_bytes))[1]).reshape(raw.shape[0], -1)


def linear_from_gguf(tensor, bias: torch.Tensor | None = None, *, rows: np.ndarray | None = None,
                     act: Act = "int8") -> QuantLinear:
    """From a `gguf.ReaderTensor` (its shape is GGUF's: (in_features, out_features))."""
    k, n = int(tensor.shape[0]), int(np.prod(tensor.shape[1:]))
    return QuantLinear(tensor.data, int(tensor.tensor_type), k, n if rows is None else len(rows), bias, rows=rows,
                       act=act)


def embedding_from_gguf(tensor) -> QuantEmbedding:
    return QuantEmbedding(tensor.data, int(tensor.tensor_type), int(tensor.shape[0]))
