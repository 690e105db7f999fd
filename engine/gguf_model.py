"""A Transformer that runs a GGUF file's quantized weights as they are.

Every matrix, the embedding and the LM head included, keeps the file's blocks (Q4_K, Q6_K, ...) and is
multiplied by the quantized kernels of engine.quant; norms and biases are the file's F32 vectors. q/k/v and
gate/up stay separate matrices (they may use different block types, e.g. Q6_K for some v in Q4_K_M files).
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from .gguf_file import GGUFFile
from .model import Rotary, Transformer

# blocks (rows, bytes per row), GGML type, input features, bias -> a module computing x @ W^T + b
LinearFactory = Callable[[np.ndarray, object, int, "torch.Tensor | None"], nn.Module]
EmbeddingFactory = Callable[[np.ndarray, object, int], nn.Module]


class Concat(nn.Module):
    """Several matrices applied to the same input, outputs side by side: stands in for a fused q/k/v or gate/up."""

    def __init__(self, parts: list[nn.Module]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p(x) for p in self.parts], dim=-1)  # (T, sum N)


def build_model(gf: GGUFFile, max_len: int, linear: LinearFactory, embedding: EmbeddingFactory) -> Transformer:
    cfg = gf.config()
    with torch.device("meta"):
        model = Transformer(cfg, max_len)

    def vector(name: str) -> nn.Parameter:
        return nn.Parameter(torch.from_numpy(gf.read_raw(name)), requires_grad=False)  # (N,) F32

    def matrix(name: str, bias: str | None = None) -> nn.Module:
        t = gf.tensors[name]
        b = torch.from_numpy(gf.read_raw(bias)) if bias and bias in gf.tensors else None
        return linear(gf.blocks(name), t.qtype, t.shape[1], b)

    model.embed = embedding(gf.blocks("token_embd.weight"), gf.tensors["token_embd.weight"].qtype, cfg.hidden_size)
    for i, block in enumerate(model.layers):
        p = f"blk.{i}."
        block.attn_norm.weight = vector(p + "attn_norm.weight")
        block.mlp_norm.weight = vector(p + "ffn_norm.weight")
        block.attn.qkv = Concat([matrix(p + f"attn_{n}.weight", p + f"attn_{n}.bias") for n in "qkv"])
        block.attn.o = matrix(p + "attn_output.weight")
        block.mlp.gate_up = Concat([matrix(p + "ffn_gate.weight"), matrix(p + "ffn_up.weight")])
        block.mlp.down = matrix(p + "ffn_down.weight")
    model.norm.weight = vector("output_norm.weight")
    model.lm_head = matrix("output.weight" if "output.weight" in gf.tensors else "token_embd.weight")
    model.rope = Rotary(cfg, max_len)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.is_meta]
    if left:
        raise ValueError(f"{gf.path}: no weights for {', '.join(left[:5])}")
    return model.eval()
