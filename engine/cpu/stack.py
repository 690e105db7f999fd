"""All decoder layers of a quantized model in one C++ call, for passes of up to 16 tokens.

A decode step, a draft step or a verify pass runs ~300 small ops besides the matmuls (norms, rope, cache
writes, attention, residuals). As separate torch calls they cost ~16 ms of a ~70 ms target step on a
2-core CPU; with them in C++ (csrc/decoder.cpp) the whole one-token pass measures 34-42 ms. Longer passes
(prompt prefill) stay in the torch modules, whose fused attention is faster there; both paths give the same
results up to float rounding, and each is batch-invariant on its own, which is what exactness needs (plain
and speculative decoding make the same prefill calls and only passes of <= 16 tokens otherwise).
"""
from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING

import torch
from torch import nn

from engine.cpu import ext
from engine.cpu.linear import QuantLinear

if TYPE_CHECKING:
    from engine.model.kv_cache import CacheView
    from engine.model.transformer import Transformer

MAX_ROWS = 16  # the kernels' row tile (csrc/quant.h)


def _linear_parts(m: nn.Module) -> list[QuantLinear] | None:
    """A QuantLinear, or the parts of a Concat of them, as the C++ stack takes them; None if neither."""
    parts = [m] if isinstance(m, QuantLinear) else list(getattr(m, "parts", []))
    if not parts or not all(isinstance(p, QuantLinear) and p.packed is not None for p in parts):
        return None
    return parts


def _spec(lin: QuantLinear) -> tuple:
    return lin.packed, lin.qtype, lin.out_features, lin.in_features, lin.bias, lin.act == "fp32"


class QuantStack:
    """Runs `model.layers` and `model.norm` for T <= 16 tokens: (T, C) embeddings -> (T, C) normed states."""

    def __init__(self, model: Transformer, mod: ModuleType | None = None) -> None:
        """mod: the compiled kernels to run on (by default the engine's, ext.load(); scripts/profile/ab_builds.py gives
        another build of them)."""
        mod = mod or ext.load()
        if mod is None:
            raise ValueError("the quantized kernels are not available")
        cfg = model.cfg
        layers = []
        for block in model.layers:
            qkv, gu = _linear_parts(block.attn.qkv), _linear_parts(block.mlp.gate_up)
            o, down = _linear_parts(block.attn.o), _linear_parts(block.mlp.down)
            if not (qkv and gu and o and down) or len(o) != 1 or len(down) != 1:
                raise ValueError("every linear layer must be quantized for the C++ stack")
            layers.append((block.attn_norm.weight.detach(), block.mlp_norm.weight.detach(), [_spec(p) for p in qkv],
                           _spec(o[0]), [_spec(p) for p in gu], _spec(down[0])))
        self._stack = mod.Stack(cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size,
                                cfg.rms_norm_eps, model.rope.cos, model.rope.sin, model.norm.weight.detach(), layers)

    @classmethod
    def of(cls, model: Transformer) -> QuantStack | None:
        """The stack for a model whose layers all run on the compiled kernels, else None."""
        try:
            return cls(model)
        except ValueError:
            return None

    def __call__(self, x: torch.Tensor, start: int, cache: CacheView) -> torch.Tensor:
        pool = cache.pool
        return self._stack.forward(x, start, pool.k, pool.v, cache.write_slots, cache.read_slots, cache.base,
                                   cache.end, torch.get_num_threads())
