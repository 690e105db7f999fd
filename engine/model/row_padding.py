"""Short passes padded to one row count where the device's kernels depend on it, so a verify pass's rows are
bitwise a plain step's.

A matmul library may pick its kernel, and so its summation order, from the shapes it is given: one row (a plain
decode step) and five (a verify pass) can round differently, and in bf16 that flips a near-tie argmax now and
then, which breaks greedy speculative output equalling plain greedy. Whether it does depends on the library, its
version and the chip (cuBLAS on an H200 gave every row count the same bits), so each module shape is probed once
at load and only those whose rows change are padded: every pass of up to ROW_WISE_MAX rows then runs them at
exactly that many. The elementwise ops between are per element already, and attention runs row by row
(engine.model.attention).
"""
from __future__ import annotations

import logging

import torch
from torch import nn

from engine.model.attention import ROW_WISE_MAX

log = logging.getLogger(__name__)


class RowPadded(nn.Module):
    """Runs `inner` on (rows, C) whenever it is given (T, C) with T < rows, and returns the first T rows."""

    def __init__(self, inner: nn.Module, rows: int = ROW_WISE_MAX) -> None:
        super().__init__()
        self.inner, self.rows = inner, rows

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        T = x.shape[0]
        if T >= self.rows:  # a prompt's chunk: the same in both modes, so left as it is
            return self.inner(x)
        padded = x.new_zeros(self.rows, *x.shape[1:])  # (rows, C)
        padded[:T] = x
        return self.inner(padded)[:T]  # (T, N)


@torch.inference_mode()
def rows_depend_on_count(module: nn.Module, rows: int = ROW_WISE_MAX) -> bool:
    """Whether any row of module's output takes other bits when it is given fewer rows. Random inputs do for the
    probe: a library picks its kernel by shape and type, not by the values."""
    w = next(module.parameters())
    gen = torch.Generator(device=w.device).manual_seed(0)
    x = torch.randn(rows, w.shape[-1], generator=gen, device=w.device, dtype=w.dtype)  # (rows, C)
    full = module(x)
    return any(not torch.equal(module(x[:m].clone()), full[:m]) for m in range(1, rows))


def pad_short_passes(model: nn.Module, rows: int = ROW_WISE_MAX, probe: bool = True) -> int:
    """Wrap each matmul and norm (the LM head too) whose rows depend on the row count on this device, or with
    probe=False every one. -> how many were wrapped."""
    verdicts: dict[tuple, bool] = {}  # one probe per kind and shape

    def pad(m: nn.Module) -> nn.Module:
        key = (type(m), *(tuple(p.shape) for p in m.parameters()))
        if probe and key not in verdicts:
            verdicts[key] = rows_depend_on_count(m, rows)
        return RowPadded(m, rows) if not probe or verdicts[key] else m

    def pad_optional(m: nn.Module | None) -> nn.Module | None:  # a norm only some families have
        return None if m is None else pad(m)

    for block in model.layers:
        block.attn_norm, block.mlp_norm = pad(block.attn_norm), pad(block.mlp_norm)
        block.attn_post_norm = pad_optional(block.attn_post_norm)
        block.mlp_post_norm = pad_optional(block.mlp_post_norm)
        block.attn.q_norm, block.attn.k_norm = pad_optional(block.attn.q_norm), pad_optional(block.attn.k_norm)
        block.attn.qkv, block.attn.o = pad(block.attn.qkv), pad(block.attn.o)
        block.mlp.gate_up, block.mlp.down = pad(block.mlp.gate_up), pad(block.mlp.down)
    model.norm, model.lm_head = pad(model.norm), pad(model.lm_head)
    padded = sum(isinstance(m, RowPadded) for m in model.modules())
    total = sum(1 for m in model.modules() if isinstance(m, nn.Linear) or type(m).__name__ == "RMSNorm")
    log.info("short passes: %d of %d matmuls and norms padded to %d rows on %s", padded, total, rows,
             next(model.parameters()).device)
    return padded
