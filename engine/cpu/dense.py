"""A dense model (a folder of safetensors) run on the kernels' BF16 or F32 units and the C++ stack.

Through oneDNN a one-row product takes another kernel than 2-16 rows, so a verify pass's rows could differ from
plain steps' in the last bits, and a greedy near-tie could go the other way. The kernels' F32 path sums every row in
the same order whatever the other rows (engine.cpu.linear), and the C++ stack does the rest of a short pass the same
way, so speculative greedy output equals plain greedy exactly here too. The weights are the checkpoint's: a bf16
checkpoint's stay bf16 (half the bytes of fp32, widened exactly as they are read), others are fp32; the arithmetic
is fp32 throughout, as through oneDNN.
"""
from __future__ import annotations

import torch
from torch import nn

from engine.model.transformer import Transformer
from engine.cpu import ext
from engine.cpu.formats import T, fmt
from engine.cpu.linear import QuantEmbedding, QuantLinear
from engine.cpu.stack import QuantStack


def _units(lin: nn.Linear, requant: int | None) -> QuantLinear:
    """F32 units, or BF16 where every weight is a bf16 value (a bf16 checkpoint: the same weights in half the
    bytes a step streams), or those re-quantized."""
    w = lin.weight.detach().float().contiguous()  # (N, K)
    half = w.to(torch.bfloat16)
    if torch.equal(half.float(), w):
        q = QuantLinear(half.view(torch.uint8).numpy(), T.BF16, lin.in_features, bias=lin.bias, act="fp32")
    else:
        q = QuantLinear(w.numpy(), T.F32, lin.in_features, bias=lin.bias, act="fp32")
    return q.requantized(requant) if requant is not None else q


def fits(model: Transformer) -> bool:
    """Every matrix's inputs come in whole units (32 inputs): true of real models, not of every tiny test one."""
    c, unit = model.cfg, fmt(T.F32).unit_k
    return all(k % unit == 0 for k in (c.hidden_size, c.num_heads * c.head_dim, c.intermediate_size))


def run_on_kernels(model: Transformer, requant: int | None = None) -> bool:
    """Swap every matrix for BF16 or F32 units (the LM head too; a tied embedding then looks its rows up there), or with
    requant=Q4_0 for those re-quantized (a draft: ~1/7 of the bytes, int8 activations), and give the model the C++
    stack. False, and the model unchanged, without the compiled kernels or where it does not fit."""
    if ext.load() is None or not fits(model):
        return False
    tied = model.lm_head.weight is model.embed.weight
    for block in model.layers:
        block.attn.qkv, block.attn.o = _units(block.attn.qkv, requant), _units(block.attn.o, requant)
        block.mlp.gate_up, block.mlp.down = _units(block.mlp.gate_up, requant), _units(block.mlp.down, requant)
    model.lm_head = _units(model.lm_head, requant)
    if tied:  # one copy of the table, not two
        model.embed = QuantEmbedding.tied(model.lm_head)
    model.stack = QuantStack.of(model)
    return True
