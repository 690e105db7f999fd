"""Int8 weight-only linears for the draft model on the CPU.

Quantizing the draft keeps speculative decoding exact: only the target's distribution decides what is
committed, so a cheaper, slightly different draft changes the acceptance rate, never the output.
"""
from __future__ import annotations

import torch
from torch import nn

from .model import Transformer


class Int8Linear(nn.Module):
    """y = x W^T with W stored as int8 rows and one bf16 scale per output row."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        w = linear.weight.detach().float()  # (N, K)
        scale = (w.abs().amax(dim=1) / 127.0).clamp_min(1e-8)  # (N,)
        self.register_buffer("weight", torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale.to(torch.bfloat16))
        self.register_buffer("bias", None if linear.bias is None else linear.bias.detach().float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        y = torch.ops.aten._weight_int8pack_mm(x.reshape(-1, shape[-1]).to(torch.bfloat16), self.weight, self.scale)
        y = y.float().reshape(*shape[:-1], -1)
        return y + self.bias if self.bias is not None else y


def int8_supported() -> bool:
    try:
        w = torch.zeros(8, 32, dtype=torch.int8)
        torch.ops.aten._weight_int8pack_mm(torch.zeros(1, 32, dtype=torch.bfloat16), w, torch.ones(8, dtype=torch.bfloat16))
        return True
    except (RuntimeError, AttributeError):
        return False


def quantize_int8(model: Transformer) -> Transformer:
    """Swap every matmul (the LM head included, even when tied to the embedding) for Int8Linear."""
    for block in model.layers:
        block.attn.qkv = Int8Linear(block.attn.qkv)
        block.attn.o = Int8Linear(block.attn.o)
        block.mlp.gate_up = Int8Linear(block.mlp.gate_up)
        block.mlp.down = Int8Linear(block.mlp.down)
    model.lm_head = Int8Linear(model.lm_head)
    return model
