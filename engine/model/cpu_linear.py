"""Faster CPU matmuls for batch-1 decoding, swapped in after loading.

`F.linear` on fp32 repacks the weight on every call once there is more than one row, so a 3-row
verify pass costs ~3x a 1-row decode step. oneDNN with the weight reordered once ("prepacked") runs
1..8 rows at nearly the cost of one, and even one row faster than F.linear. Same fp32 maths, only
the summation order differs (~1e-6 relative).

The draft may go further, to int8 weights with bf16 activations: speculative decoding stays exact,
because only the target's distribution decides what is committed; a cheaper, slightly different draft
changes the acceptance rate, never the output.
"""
from __future__ import annotations

import torch
from torch import nn

from engine.model.transformer import Transformer


class PackedLinear(nn.Module):
    """fp32 y = x W^T + b with W held in oneDNN's blocked layout."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight = linear.weight.detach().float().contiguous().to_mkldnn()  # (N, K), blocked
        self.bias = None if linear.bias is None else linear.bias.detach().float().contiguous().to_mkldnn()
        self.out_features = linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1]).float().contiguous().to_mkldnn()  # (T, K)
        y = torch._C._nn.mkldnn_linear(x2, self.weight, self.bias).to_dense()  # (T, N)
        return y.reshape(*shape[:-1], self.out_features)


class Int8Linear(nn.Module):
    """y = x W^T + b with W stored as int8 rows and one bf16 scale per output row."""

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
        y = y.float().reshape(*shape[:-1], -1)  # (.., N)
        return y + self.bias if self.bias is not None else y


def _works(make: type[nn.Module]) -> bool:
    try:
        lin = nn.Linear(32, 8)
        out = make(lin)(torch.randn(3, 32))
        return out.shape == (3, 8)
    except (RuntimeError, AttributeError, NotImplementedError):
        return False


def packed_supported() -> bool:
    return torch.backends.mkldnn.is_available() and _works(PackedLinear)


def int8_supported() -> bool:
    return _works(Int8Linear)


def swap_linears(model: Transformer, make: type[nn.Module]) -> Transformer:
    """Replace every matmul (the LM head too, even when tied to the embedding) with make(linear)."""
    for block in model.layers:
        block.attn.qkv = make(block.attn.qkv)
        block.attn.o = make(block.attn.o)
        block.mlp.gate_up = make(block.mlp.gate_up)
        block.mlp.down = make(block.mlp.down)
    model.lm_head = make(model.lm_head)
    return model
