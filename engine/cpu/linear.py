"""nn.Modules over GGML blocks: QuantLinear (y = x W^T + b) and QuantEmbedding (row look-up).

The GGUF bytes are read once, straight from the file's memory map, and repacked into the kernels' layout
(same quants and scales, grouped 8 output features at a time; see csrc/quant.h). What is kept is as
compact as the file. The weights a layer computes with are exactly `gguf.quants.dequantize`'s
(`dequantize()` returns them, from the packed data).

Two activation modes:
- "int8" (default): activations quantized per 32 inputs to int8 (scale amax/127), integer dot products.
  The weights enter exactly; the activation rounding costs ~0.3-0.7% relative error per output.
- "fp32": exact activations; every product and sum in fp32 (the reference the int8 mode is measured by).
Both are batch-invariant: a row's output is bitwise the same whatever other rows share the call, and the
same on every instruction set (csrc/kernels_scalar.cpp states the order of operations).

Without the compiled extension (see ext.py) the same modules run a pure-torch fallback: weights
dequantized once to fp32 (memory-hungry), one row at a time (so still batch-invariant), fp32 activations.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np
import torch
from gguf.quants import dequantize as gguf_dequantize
from torch import nn

from engine.cpu import ext
from engine.cpu.formats import GROUP, T, fmt, row_bytes

Act = Literal["int8", "fp32"]


def _as_rows(raw: np.ndarray, qtype: int, k: int) -> np.ndarray:
    """GGUF tensor data -> (rows, row_bytes) uint8, without copying (F16/F32 data arrive as float arrays)."""
    arr = np.asarray(raw)
    if arr.dtype != np.uint8:
        arr = arr.reshape(-1).view(np.uint8)
    arr = arr.reshape(-1, row_bytes(qtype, k))
    if not arr.flags.c_contiguous:
        raise ValueError("GGUF tensor data must be C-contiguous")
    return arr


def _dequantize(raw: np.ndarray, qtype: int) -> torch.Tensor:
    """GGUF rows (N, row_bytes) uint8 -> (N, K) float32 weights, gguf.quants.dequantize's."""
    w = gguf_dequantize(raw, T(qtype))
    return torch.from_numpy(w.copy() if qtype == T.F32 else w)  # gguf's F32 "dequantization" is a view of raw


def _threads() -> int:
    return max(1, torch.get_num_threads())


def packed_slices(specs: Sequence[tuple[int, int, int]],
                  take: Callable[[int], torch.Tensor] | None = None) -> list[torch.Tensor] | None:
    """One buffer for parts (qtype, N, K) to be repacked side by side (`out=`), so that `concat` of the
    parts copies nothing; None without the compiled kernels. take(nbytes): where the buffer comes from
    (e.g. `engine.model.pages.Arena.take`); default a new tensor."""
    mod = ext.load()
    if mod is None:
        return None
    sizes = [mod.packed_bytes(q, n, k) for q, n, k in specs]
    buf = take(sum(sizes)) if take is not None else torch.empty(sum(sizes), dtype=torch.uint8)
    return list(buf.split(sizes))


def _adjacent(parts: Sequence[QuantLinear]) -> torch.Tensor | None:
    """The parts' packed bytes as one tensor when they already lie back to back in one buffer, else None."""
    first = parts[0].packed
    storage, end = first.untyped_storage(), first.data_ptr()
    for p in parts:
        if p.packed.untyped_storage().data_ptr() != storage.data_ptr() or p.packed.data_ptr() != end:
            return None
        end += p.packed.numel()
    offset = first.data_ptr() - storage.data_ptr()
    return torch.empty(0, dtype=torch.uint8).set_(storage, offset, (end - first.data_ptr(),))


class QuantLinear(nn.Module):
    """y = x W^T (+ bias) for x (..., in_features) float32, W (out_features, in_features) as GGML blocks.

    raw: the tensor's GGUF data, (rows, row_bytes) uint8 (e.g. `GGUFReader(path).tensors[i].data`).
    rows: which raw row each output feature takes (default: all, in order); e.g. an un-permutation.
    out: a uint8 slice to repack into (see `packed_slices`), else a new buffer.
    """

    def __init__(self, raw: np.ndarray, qtype: int, in_features: int, out_features: int | None = None,
                 bias: torch.Tensor | None = None, *, rows: np.ndarray | None = None, act: Act = "int8",
                 out: torch.Tensor | None = None) -> None:
        super().__init__()
        self.format = fmt(qtype)
        self.qtype = int(self.format.qtype)
        raw = _as_rows(raw, self.qtype, in_features)
        self.in_features = in_features
        self.out_features = out_features if out_features is not None else (len(rows) if rows is not None else raw.shape[0])
        if rows is not None:
            rows = np.ascontiguousarray(rows, dtype=np.int64)
            if rows.shape != (self.out_features,) or rows.min(initial=0) < 0 or rows.max(initial=0) >= raw.shape[0]:
                raise ValueError(f"rows must be {self.out_features} indices into {raw.shape[0]} rows")
        elif raw.shape[0] != self.out_features:
            raise ValueError(f"tensor has {raw.shape[0]} rows, expected {self.out_features}")
        self.act: Act = act if self.format.quantized else "fp32"  # F16/BF16/F32 weights have no integer path
        if bias is not None and bias.shape != (self.out_features,):
            raise ValueError(f"bias shape {tuple(bias.shape)} != ({self.out_features},)")
        self.register_buffer("bias", None if bias is None else bias.detach().float().contiguous(), persistent=False)
        self._mod = ext.load()
        self._raw, self._rows, self._dense = None, None, None
        if self._mod is not None:
            rt = None if rows is None else torch.from_numpy(rows)
            packed = self._mod.repack(raw, self.qtype, self.out_features, in_features, rt, _threads(), out)
            self.register_buffer("packed", packed, persistent=False)  # (bytes,) uint8
        else:
            self._raw, self._rows = raw, rows  # keeps the memory map alive; dequantized on first use
            self.register_buffer("packed", None, persistent=False)

    @classmethod
    def concat(cls, parts: Sequence[QuantLinear]) -> QuantLinear:
        """One layer whose outputs are the parts' outputs side by side (fused q/k/v, gate/up). Needs one type
        and, for the packed layout, every part but the last a multiple of 8 outputs (of 64 over more than 2048
        inputs)."""
        first = parts[0]
        if any(p.qtype != first.qtype or p.in_features != first.in_features or p.act != first.act for p in parts):
            raise ValueError("concat needs parts of one type, input size and activation mode")
        # the packed layout keeps runs of RUN groups together over a long K (quant.h, Packing): a part's must end
        run = GROUP * (first._mod.RUN if first._mod is not None and first.in_features > first._mod.SLICE_K else 1)
        if any(p.out_features % run for p in parts[:-1]):
            raise ValueError(f"concat needs parts with multiples of {run} outputs")
        biases = [p.bias if p.bias is not None else torch.zeros(p.out_features) for p in parts]
        bias = torch.cat(biases) if any(p.bias is not None for p in parts) else None
        packed = None
        if first._mod is not None:
            packed = _adjacent(parts)  # repacked side by side already (packed_slices): no copy
            packed = torch.cat([p.packed for p in parts]) if packed is None else packed
        out = cls._made(first._mod, first.qtype, first.in_features, sum(p.out_features for p in parts), first.act,
                        bias, packed)
        if packed is None:
            out._dense = torch.cat([p.dequantize() for p in parts])
        return out

    def requantized(self, qtype: int, out: torch.Tensor | None = None) -> QuantLinear:
        """The same layer with its weights re-quantized to `qtype` (Q4_0 only): each output's blocks of 32 exact
        weights quantized by ggml's reference rule. A cheaper draft model costs acceptance, never exactness.
        out: a uint8 slice to write the new units into (see `packed_slices`)."""
        if T(qtype) != T.Q4_0 or self._mod is None:
            raise ValueError(f"re-quantizing needs the compiled kernels and Q4_0 (asked for {T(qtype).name})")
        packed = self._mod.requant_q40(self.packed, self.qtype, self.out_features, self.in_features, _threads(), out)
        act = self.act if self.format.quantized else "int8"  # F16/BF16/F32 had no integer path; Q4_0 has
        return self._made(self._mod, qtype, self.in_features, self.out_features, act, self.bias, packed)

    @classmethod
    def _made(cls, mod, qtype: int, in_features: int, out_features: int, act: Act, bias: torch.Tensor | None,
              packed: torch.Tensor | None) -> QuantLinear:
        """A layer over weights already packed (or, without the kernels, to be set as _dense by the caller)."""
        out = cls.__new__(cls)
        nn.Module.__init__(out)
        out.format, out.qtype, out.act = fmt(qtype), int(qtype), act
        out.in_features, out.out_features = in_features, out_features
        out.register_buffer("bias", bias, persistent=False)
        out._mod, out._raw, out._rows, out._dense = mod, None, None, None
        out.register_buffer("packed", packed, persistent=False)
        return out

    @property
    def nbytes(self) -> int:
        """Bytes the layer keeps for its weight (packed, or the fallback's fp32 copy once made)."""
        t = self.packed if self.packed is not None else self._dense
        return 0 if t is None else t.numel() * t.element_size()

    def dequantize(self) -> torch.Tensor:
        """The (out, in) float32 weights this layer computes with: bit for bit gguf.quants.dequantize."""
        if self._mod is not None:
            idx = torch.arange(self.out_features)
            return self._mod.dequant_cols(self.packed, self.qtype, self.out_features, self.in_features, idx)
        if self._dense is None:
            src = self._raw if self._rows is None else self._raw[self._rows]
            self._dense = _dequantize(src, self.qtype)
            self._raw = None
        return self._dense

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Checked here, not only in C++: some torch builds crash instead of raising when an extension
        # function with tensor arguments throws.
        if x.shape[-1:] != (self.in_features,):
            raise ValueError(f"x: (..., {self.in_features}) expected, got {tuple(x.shape)}")
        if self._mod is not None:  # (..., K) -> (..., N); flattening, casting, threads: all in C++ (per-call cost)
            return self._mod.matmul(self.packed, self.qtype, self.out_features, self.in_features, x, self.bias,
                                    self.act == "fp32", -1)
        shape = x.shape
        x2 = x.reshape(-1, self.in_features).float().contiguous()  # (R, K)
        w = self.dequantize()  # (N, K)
        y = torch.stack([torch.mv(w, row) for row in x2]) if len(x2) else x2.new_zeros(0, self.out_features)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, type={T(self.qtype).name}, "
                f"act={self.act}, bias={self.bias is not None}")


class QuantEmbedding(nn.Module):
    """ids -> rows of a (num_embeddings, dim) GGML matrix, dequantized exactly, only the rows looked up.
    `QuantEmbedding.tied(head)` shares the LM head's packed blocks (tied embeddings cost nothing extra)."""

    def __init__(self, raw: np.ndarray, qtype: int, dim: int, *, act: Act = "int8") -> None:
        super().__init__()
        self.table = QuantLinear(raw, qtype, dim, act=act)

    @classmethod
    def tied(cls, head: QuantLinear) -> QuantEmbedding:
        out = cls.__new__(cls)
        nn.Module.__init__(out)
        out.table = head
        return out

    @property
    def num_embeddings(self) -> int:
        return self.table.out_features

    @property
    def embedding_dim(self) -> int:
        return self.table.in_features

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = self.table
        flat = ids.reshape(-1).long()
        if len(flat) and (int(flat.min()) < 0 or int(flat.max()) >= t.out_features):
            raise IndexError(f"token id out of range [0, {t.out_features})")
        if t._mod is not None:
            out = t._mod.dequant_cols(t.packed, t.qtype, t.out_features, t.in_features, flat)  # (T, C)
        else:
            out = t.dequantize()[flat]
        return out.reshape(*ids.shape, t.in_features)


class FileEmbedding(nn.Module):
    """ids -> rows of a GGML matrix read from the file as stored (a memory map) and dequantized exactly (by the
    kernels' dequantizer, or gguf's without them), bit for bit what QuantEmbedding gives. An untied embedding is only ever read a few rows at a
    time: repacking it would hold its whole size in RAM (225 MB for the embedded pair) for nothing."""

    def __init__(self, raw: np.ndarray, qtype: int, dim: int) -> None:
        super().__init__()
        self.format = fmt(qtype)
        self.raw = _as_rows(raw, int(self.format.qtype), dim)  # (V, row_bytes), a view of the file
        self.qtype, self.num_embeddings, self.embedding_dim = int(self.format.qtype), self.raw.shape[0], dim
        self._mod = ext.load()

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        flat = ids.reshape(-1).long()
        if len(flat) and (int(flat.min()) < 0 or int(flat.max()) >= self.num_embeddings):
            raise IndexError(f"token id out of range [0, {self.num_embeddings})")
        if self._mod is not None and len(flat):
            # the rows repacked and decoded in C++ (the same exact dequantizer): gguf's numpy took ~0.3 ms a draft step
            packed = self._mod.repack(self.raw, self.qtype, len(flat), self.embedding_dim, flat.contiguous(), 1, None)
            rows = self._mod.dequant_cols(packed, self.qtype, len(flat), self.embedding_dim, torch.arange(len(flat)))
        else:
            rows = _dequantize(self.raw[flat.numpy()], self.qtype)  # (T, C)
        return rows.reshape(*ids.shape, self.embedding_dim)

