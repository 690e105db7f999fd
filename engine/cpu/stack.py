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


# What the C++ stack runs of a block (engine.model.transformer's module names): a block or an attention holding any
# other module has a feature the stack does not know, and the torch modules run that model instead.
BLOCK_PARTS = {"attn_norm", "attn", "mlp_norm", "mlp", "attn_post_norm", "mlp_post_norm"}
ATTN_PARTS = {"qkv", "o", "q_norm", "k_norm"}
MLP_PARTS = {"gate_up", "down"}
ACTIVATIONS = ("silu", "gelu_tanh")


def _norm(m: nn.Module | None, n: int) -> torch.Tensor | None:
    """A plain RMSNorm's (n,) fp32 weights, None without one; ValueError for anything else there."""
    if m is None:
        return None
    w = getattr(m, "weight", None)
    if type(m).__name__ != "RMSNorm" or w is None or w.shape != (n,) or w.is_meta:
        raise ValueError(f"a norm the C++ stack cannot run: {type(m).__name__}")
    return w.detach().float().contiguous()


def _table(rope: nn.Module, rotary_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = rope.cos, rope.sin  # (P, rotary_dim)
    if cos.dim() != 2 or cos.shape[1] != rotary_dim or sin.shape != cos.shape:
        raise ValueError(f"rotary tables {tuple(cos.shape)} where (P, {rotary_dim}) is needed")
    return cos.float().contiguous(), sin.float().contiguous()


def _features(model: Transformer, rotary_dim: int) -> list[tuple]:
    """Per layer (q_norm, k_norm, attn_post_norm, mlp_post_norm, window, cos, sin) as csrc/bindings.cpp takes them,
    or [] when no layer has any of them (a Llama/Qwen2 stack, which a build from before them runs too)."""
    cfg, local = model.cfg, getattr(model, "rope_local", None)
    local_table = _table(local, rotary_dim) if local is not None else (None, None)
    # A NoPE layer turns by angle zero: cos 1 and sin 0 leave every value as it is (x * 1 - y * 0 is x exactly)
    still = None
    if not all(getattr(b.attn, "rotates", True) for b in model.layers):
        cos = model.rope.cos
        still = (torch.ones_like(cos, dtype=torch.float32).contiguous(),
                 torch.zeros_like(cos, dtype=torch.float32).contiguous())
    out = []
    for block in model.layers:
        attn, mlp = block.attn, block.mlp
        for m, known in ((block, BLOCK_PARTS), (attn, ATTN_PARTS), (mlp, MLP_PARTS)):
            extra = {name for name, _ in m.named_children()} - known
            if extra:
                raise ValueError(f"the C++ stack does not run {type(m).__name__}.{min(extra)}")
        window = getattr(attn, "window", None) or 0
        if window < 0:
            raise ValueError(f"sliding window {window}")
        # windowed layers turn by the local table where the model has one (Gemma 3), else every layer by the global
        cos, sin = local_table if window else (None, None)
        if not getattr(attn, "rotates", True):
            cos, sin = still
        out.append((_norm(getattr(attn, "q_norm", None), cfg.head_dim), _norm(getattr(attn, "k_norm", None), cfg.head_dim),
                    _norm(getattr(block, "attn_post_norm", None), cfg.hidden_size),
                    _norm(getattr(block, "mlp_post_norm", None), cfg.hidden_size), int(window), cos, sin))
    plain = all(all(t is None for t in (*f[:4], f[5])) and f[4] == 0 for f in out)
    return [] if plain else out


def _stack_wide(model: Transformer) -> tuple[int, float, str]:
    """(rotary_dim, attention scale, activation), the same in every layer; ValueError where they differ or where the
    stack cannot run one."""
    cfg = model.cfg
    dims = {int(getattr(b.attn, "rotary_dim", 0) or cfg.head_dim) for b in model.layers}
    scales = {float(getattr(b.attn, "scale", 0.0) or cfg.head_dim ** -0.5) for b in model.layers}
    # the MLP's own choice where it holds one (what the torch modules run), else the config's
    activations = {getattr(b.mlp, "activation", getattr(cfg, "activation", "silu")) for b in model.layers}
    if len(dims) != 1 or len(scales) != 1 or len(activations) != 1:
        raise ValueError("rotary dims, attention scales or activations that differ between layers")
    activation = activations.pop()
    if activation not in ACTIVATIONS:
        raise ValueError(f"the C++ stack does not run the activation {activation!r}")
    rotary_dim = dims.pop()
    if not (2 <= rotary_dim <= cfg.head_dim and rotary_dim % 2 == 0):
        raise ValueError(f"rotary_dim {rotary_dim} with head_dim {cfg.head_dim}")
    return rotary_dim, scales.pop(), activation


class QuantStack:
    """Runs `model.layers` and `model.norm` for T <= 16 tokens: (T, C) embeddings -> (T, C) normed states."""

    def __init__(self, model: Transformer, mod: ModuleType | None = None) -> None:
        """mod: the compiled kernels to run on (by default the engine's, ext.load(); scripts/profile/ab_builds.py gives
        another build of them)."""
        mod = mod or ext.load()
        if mod is None:
            raise ValueError("the quantized kernels are not available")
        cfg = model.cfg
        residual = {float(getattr(b, "residual_scale", 1.0)) for b in model.layers}
        if len(residual) != 1:
            raise ValueError("residual scales that differ between layers")
        residual_scale = residual.pop()
        layers = []
        for block in model.layers:
            qkv, gu = _linear_parts(block.attn.qkv), _linear_parts(block.mlp.gate_up)
            o, down = _linear_parts(block.attn.o), _linear_parts(block.mlp.down)
            if not (qkv and gu and o and down) or len(o) != 1 or len(down) != 1:
                raise ValueError("every linear layer must be quantized for the C++ stack")
            layers.append((block.attn_norm.weight.detach(), block.mlp_norm.weight.detach(), [_spec(p) for p in qkv],
                           _spec(o[0]), [_spec(p) for p in gu], _spec(down[0])))
        rotary_dim, scale, activation = _stack_wide(model)
        cos, sin = _table(model.rope, rotary_dim)
        args = (cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size,
                cfg.rms_norm_eps, cos, sin, model.norm.weight.detach(), layers)
        features = _features(model, rotary_dim)
        if (not features and rotary_dim == cfg.head_dim and scale == cfg.head_dim ** -0.5 and activation == "silu"
                and residual_scale == 1.0):
            self._stack = mod.Stack(*args)  # the arguments every build takes
            return
        extra = {"residual_scale": residual_scale} if residual_scale != 1.0 else {}  # a build before it: refused
        try:
            self._stack = mod.Stack(*args, features=features, rotary_dim=rotary_dim, attn_scale=scale,
                                    activation=activation, **extra)
        except TypeError as e:  # a build from before these features (scripts/profile/ab_builds.py's base)
            raise ValueError(f"these kernels do not run this model's layers: {e}") from e

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
