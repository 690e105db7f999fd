"""Short passes on a GPU padded to one fixed row count, so a verify pass's rows are bitwise a plain step's.

A GPU matmul library picks its kernel, and so its summation order, from the shapes it is given: one row (a
plain decode step) and five rows (a verify pass) round differently, and in bf16 that flips a near-tie
argmax now and then, which breaks greedy speculative output equalling plain greedy. Padding every pass of
up to ROW_WISE_MAX rows to exactly that many gives every such pass the same kernels; a row's result depends
only on its own input. Decoding at batch 1 is bound by reading the weights, so the extra rows cost little.
The elementwise ops between are per element already, and attention runs row by row (engine.model.attention).
"""
from __future__ import annotations

import torch
from torch import nn

from engine.model.attention import ROW_WISE_MAX


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


def pad_short_passes(model: nn.Module, rows: int = ROW_WISE_MAX) -> nn.Module:
    """Wrap every matmul and norm whose kernel could depend on the row count (the LM head too)."""
    for block in model.layers:
        block.attn_norm, block.mlp_norm = RowPadded(block.attn_norm, rows), RowPadded(block.mlp_norm, rows)
        block.attn.qkv, block.attn.o = RowPadded(block.attn.qkv, rows), RowPadded(block.attn.o, rows)
        block.mlp.gate_up, block.mlp.down = RowPadded(block.mlp.gate_up, rows), RowPadded(block.mlp.down, rows)
    model.norm, model.lm_head = RowPadded(model.norm, rows), RowPadded(model.lm_head, rows)
    return model
