"""A dense fp32 model (a folder of safetensors) run on the kernels' F32 units and the C++ stack.

Through oneDNN a one-row product takes another kernel than 2-16 rows, so a verify pass's rows could differ from
plain steps' in the last bits, and a greedy near-tie could go the other way. The kernels' F32 path sums every row in
the same order whatever the other rows (engine.quant.linear), and the C++ stack does the rest of a short pass the same
way, so speculative greedy output equals plain greedy exactly here too. The weights are the checkpoint's, widened
to fp32 exactly; the arithmetic is fp32 throughout, as through oneDNN.
"""
from __future__ import annotations

from torch import nn

from engine.model.transformer import Transformer
from engine.quant import ext
from engine.quant.formats import T, fmt
from engine.quant.linear import QuantEmbedding, QuantLinear
from engine.quant.stack import QuantStack


def _f32(lin: nn.Linear) -> QuantLinear:
    w = lin.weight.detach().float().contiguous()  # (N, K)
    return QuantLinear(w.numpy(), T.F32, lin.in_features, bias=lin.bias, act="fp32")


def fits(model: Transformer) -> bool:
    """Every matrix's inputs come in whole F32 units (32 inputs): true of real models, not of every tiny test one."""
    c, unit = model.cfg, fmt(T.F32).unit_k
    return all(k % unit == 0 for k in (c.hidden_size, c.num_heads * c.head_dim, c.intermediate_size))


def run_on_kernels(model: Transformer) -> bool:
    """Swap every matrix for F32 units (the LM head too; a tied embedding then looks its rows up there) and give
    the model the C++ stack. False, and the model unchanged, without the compiled kernels or where it does not fit."""
    if ext.load() is None or not fits(model):
        return False
    tied = model.lm_head.weight is model.embed.weight
    for block in model.layers:
        block.attn.qkv, block.attn.o = _f32(block.attn.qkv), _f32(block.attn.o)
        block.mlp.gate_up, block.mlp.down = _f32(block.mlp.gate_up), _f32(block.mlp.down)
    model.lm_head = _f32(model.lm_head)
    if tied:  # one copy of the table, not two
        model.embed = QuantEmbedding.tied(model.lm_head)
    model.stack = QuantStack.of(model)
    return True
