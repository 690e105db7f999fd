"""The decoder of every family the engine runs (engine.model.families), for batch size 1 over a paged KV cache.

A family is a set of ModelConfig fields read here (q/k norms, sandwich norms, the MLP's activation, windowed layers
with their own RoPE table, partial rotary, NoPE layers, Granite's residual and logit scales), not a path of its own. q/k/v and gate/up are fused into one matmul each:
fewer, larger kernels run faster at decode time.
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from engine.api.config import ModelConfig
from engine.model.attention import ROW_WISE_MAX
from engine.model.head_part import HeadPart
from engine.model.kv_cache import CacheView
from engine.model.row_padding import pad_short_passes
from engine.model.slot_view import SlotView
from engine.model.step_graphs import StepGraphs, exact_graphs, graphs_wanted

Angles = tuple[torch.Tensor, torch.Tensor]  # cos and the signed sin at a pass's positions, each (T, 1, rotary_dim)


def rope_frequencies(cfg: ModelConfig, local: bool = False) -> torch.Tensor:
    """Inverse frequencies (rotary_dim/2,): the global layers' (rope_theta, with Llama 3's, linear or LongRoPE
    scaling when configured) or, with local, the windowed layers' (rope_local_theta, never scaled)."""
    d = cfg.rotary_dim
    theta = cfg.rope_local_theta if local else cfg.rope_theta
    rs = None if local else cfg.rope_scaling
    kind = rs.get("rope_type", rs.get("type")) if rs else None
    # fp32 throughout, the way the reference implementation rounds: angles at long positions amplify ulps.
    exponents = torch.arange(0, d, 2, dtype=torch.int64).float() / d
    if kind == "longrope":  # the short factors: the context is capped where they end (ModelConfig)
        return 1.0 / (torch.tensor(rs["short_factor"], dtype=torch.float32) * theta ** exponents)
    inv = 1.0 / (theta ** exponents)
    if kind == "linear":
        inv /= rs["factor"]
    if kind == "llama3":
        factor, lo, hi = rs["factor"], rs.get("low_freq_factor", 1.0), rs.get("high_freq_factor", 4.0)
        old_ctx = rs.get("original_max_position_embeddings", 8192)
        wavelen = 2 * math.pi / inv
        smooth = ((old_ctx / wavelen) - lo) / (hi - lo)
        scaled = torch.where(wavelen > old_ctx / lo, inv / factor, inv)  # long waves: slowed down
        mid = (wavelen >= old_ctx / hi) & (wavelen <= old_ctx / lo)  # between: blended
        inv = torch.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
    return inv


# The model is a shell until a loader assigns its weights (from_state_dict here, engine.io.gguf_model for GGUF):
# matrices and norms are placeholders on the meta device and are never initialised. Building them with an
# explicit device, not under `with torch.device("meta")`, matters: ops without a meta kernel then go through
# Python decompositions, whose first use imports torch._dynamo (seconds at every load).


class Linear(nn.Linear):
    def __init__(self, in_features: int, out_features: int, bias: bool) -> None:
        super().__init__(in_features, out_features, bias=bias, device="meta")

    def reset_parameters(self) -> None:  # weights come from the checkpoint
        pass


class Embedding(nn.Embedding):
    def reset_parameters(self) -> None:  # weights come from the checkpoint
        pass


class Rotary(nn.Module):
    """cos and sin rows by position, (P, rotary_dim), already times LongRoPE's attention factor when there is one."""

    def __init__(self, cfg: ModelConfig, max_len: int, local: bool = False) -> None:
        super().__init__()
        t = torch.arange(max_len, dtype=torch.float32)
        freqs = torch.outer(t, rope_frequencies(cfg, local))  # (P, R/2)
        emb = torch.cat([freqs, freqs], dim=-1)  # (P, R)
        rs = None if local else cfg.rope_scaling
        factor = float(rs.get("attention_factor", 1.0)) if rs else 1.0
        cos, sin = emb.cos(), emb.sin()
        if factor != 1.0:
            cos, sin = cos * factor, sin * factor
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def at(self, pos: slice | torch.Tensor, dtype: torch.dtype) -> Angles:
        """cos and sin at positions pos (a slice, or a (T,) tensor inside a CUDA graph), each (T, 1, D) in dtype,
        sin's first half negated (see rotate). Made once per pass: every layer rotates by the same angles."""
        cos = self.cos[pos].unsqueeze(1).to(dtype)  # (T, 1, D)
        sin = self.sin[pos].unsqueeze(1).to(dtype)
        half = sin.shape[-1] // 2
        return cos, torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)


def rotate(x: torch.Tensor, angles: Angles) -> torch.Tensor:
    """Rotate x (T, H, D) by Rotary.at's angles (T, 1, R): x cos + (-x2, x1) sin, where (-x2, x1) sin is x rolled by
    half times the signed sin, the same products in one kernel fewer. With R < D only the first R dims turn."""
    cos, signed_sin = angles
    R = cos.shape[-1]
    if R < x.shape[-1]:
        turned = rotate(x[..., :R], angles)  # (T, H, R)
        return torch.cat([turned, x[..., R:]], dim=-1)  # (T, H, D)
    return x * cos + x.roll(R // 2, dims=-1) * signed_sin


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim, device="meta"))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.layer = layer
        self.h, self.hkv, self.d = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.rotary_dim, self.scale = cfg.rotary_dim, cfg.attn_scale
        self.window = cfg.sliding_window if cfg.windowed[layer] else None  # keys p - window + 1 .. p, or all
        self.rotates = cfg.rotated[layer]  # False: a NoPE layer (SmolLM3) attends by content alone
        self.qkv = Linear(cfg.hidden_size, (self.h + 2 * self.hkv) * self.d, bias=cfg.attention_bias)
        self.o = Linear(self.h * self.d, cfg.hidden_size, bias=False)
        self.q_norm = RMSNorm(self.d, cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = RMSNorm(self.d, cfg.rms_norm_eps) if cfg.qk_norm else None

    def forward(self, x: torch.Tensor, angles: Angles, cache: CacheView | SlotView) -> torch.Tensor:
        T, qk_width = x.shape[0], (self.h + self.hkv) * self.d
        qkv = self.qkv(x)  # (T, (H + 2 Hkv) D)
        qk = qkv[:, :qk_width].view(T, self.h + self.hkv, self.d)  # (T, H + Hkv, D)
        if self.q_norm is not None:  # per head, before RoPE
            qk = torch.cat([self.q_norm(qk[:, : self.h]), self.k_norm(qk[:, self.h :])], dim=1)
        # q and k rotated in one go: half the elementwise kernels, each a launch that a GPU step waits on
        if self.rotates:
            qk = rotate(qk, angles)  # (T, H + Hkv, D)
        q, k = qk[:, : self.h], qk[:, self.h :]  # (T, H, D), (T, Hkv, D)
        keys, values = cache.update(self.layer, k, qkv[:, qk_width:].view(T, self.hkv, self.d))  # (Hkv, S, D)
        return self.o(cache.attend(q, keys, values, self.window, self.scale))  # (T, C)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.inter, self.activation = cfg.intermediate_size, cfg.activation
        self.gate_up = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).split(self.inter, dim=-1)
        act = F.silu(gate) if self.activation == "silu" else F.gelu(gate, approximate="tanh")
        return self.down(act * up)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = Attention(cfg, layer)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)
        # Gemma's sandwich: each sublayer's output normed again before it joins the residual
        self.attn_post_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps) if cfg.sandwich_norm else None
        self.mlp_post_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps) if cfg.sandwich_norm else None
        self.residual_scale = cfg.residual_scale  # Granite's residual_multiplier on each sublayer's output

    def forward(self, x: torch.Tensor, angles: Angles, cache: CacheView | SlotView) -> torch.Tensor:
        h = self.attn(self.attn_norm(x), angles, cache)
        x = x + self._branch(h if self.attn_post_norm is None else self.attn_post_norm(h))
        h = self.mlp(self.mlp_norm(x))
        return x + self._branch(h if self.mlp_post_norm is None else self.mlp_post_norm(h))

    def _branch(self, h: torch.Tensor) -> torch.Tensor:
        return h if self.residual_scale == 1.0 else h * self.residual_scale


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, max_len: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = Embedding(cfg.vocab_size, cfg.hidden_size, device="meta")
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.embed.weight
        self.rope = Rotary(cfg, max_len or cfg.max_position_embeddings)
        # the windowed layers' table where their RoPE base is their own (Gemma 3), else they share self.rope
        self.rope_local = (Rotary(cfg, max_len or cfg.max_position_embeddings, local=True)
                           if cfg.rope_local_theta is not None and any(cfg.windowed) else None)
        # Optional fast path for passes of <= ROW_WISE_MAX tokens: all layers and the final norm in one call,
        # (T, C) -> (T, C); set by loaders whose weights allow it (engine.cpu.stack for GGUF models).
        self.stack: Callable[[torch.Tensor, int, CacheView], torch.Tensor] | None = None
        # The vocabulary part a trimmed LM head scores (a draft's, engine.spec.draft_vocab); the others get -inf.
        self.head: HeadPart | None = None
        # The buffer the packed matrices were carved from (engine.model.pages.Arena.taken), for HugePages; or None.
        self.weights: torch.Tensor | None = None
        # The KV pool's element type where it is not the weights' (a GGUF model's: float16, set by its loader).
        self.kv_dtype: torch.dtype | None = None
        # Short passes replayed as CUDA graphs (engine.model.step_graphs), set at load on a CUDA device.
        self.graphs: StepGraphs | None = None

    @torch.inference_mode()
    def forward(self, ids: torch.Tensor, start: int, cache: CacheView, last_only: bool = False,
                head_rows: bool = False) -> torch.Tensor:
        """ids (T,) at positions [start, start + T) -> logits (T, V), or (1, V) with last_only. With head_rows, a
        trimmed head's own rows (T, len(head)) are returned as they are, not widened to V."""
        assert start == cache.end - len(ids), "the cache view is for another pass"
        if self.graphs is not None and len(ids) <= ROW_WISE_MAX:
            logits = self.graphs.run(self.scores, ids, cache, last_only)
        else:
            logits = self.scores(ids, cache, last_only)
        if self.head is None or head_rows:
            return logits
        return self.head.widen(logits, float("-inf"))  # (T, V)

    def scores(self, ids: torch.Tensor, cache: CacheView | SlotView, last_only: bool) -> torch.Tensor:
        """The pass itself: ids (T,) -> the LM head's rows (T, V) or a trimmed head's (T, len(head)), in fp32;
        (1, ...) with last_only."""
        x = self.embed(ids)  # (T, C)
        if self.cfg.embedding_scale != 1.0:  # the scale rounded to the weights' dtype first, as HF does
            x = x * torch.tensor(self.cfg.embedding_scale, dtype=x.dtype).item()
        if self.stack is not None and len(ids) <= ROW_WISE_MAX:
            x = self.stack(x, cache.end - len(ids), cache)  # (T, C), normed
        else:
            angles = self.rope.at(cache.positions, x.dtype)
            local = self.rope_local.at(cache.positions, x.dtype) if self.rope_local is not None else angles
            for block in self.layers:
                x = block(x, local if block.attn.window is not None else angles, cache)
            x = self.norm(x)
        if last_only:
            x = x[-1:]
        logits = self.lm_head(x).float()  # (T, V), or (T, len(head))
        return logits if self.cfg.logit_scale == 1.0 else logits / self.cfg.logit_scale

    @classmethod
    def from_state_dict(
        cls, cfg: ModelConfig, sd: dict[str, torch.Tensor], dtype: torch.dtype, device: str | torch.device,
        max_len: int | None = None,
    ) -> Transformer:
        """Build from Hugging Face tensor names, fusing q/k/v and gate/up as we go (or taking Phi-3's fused ones as
        they are) and folding a norm offset into the norms; on a GPU, short passes are padded to one row count where
        the kernels need it (engine.model.row_padding)."""
        model = cls(cfg, max_len)
        own = {name: hf(sd) for name, hf in hf_sources(cfg).items()}
        own = {k: v.to(device=device, dtype=dtype) for k, v in own.items()}
        model.load_state_dict(own, strict=False, assign=True)
        if cfg.tie_word_embeddings:
            model.lm_head.weight = model.embed.weight
        model.rope.to(device)
        if model.rope_local is not None:
            model.rope_local.to(device)
        missing = [n for n, t in model.state_dict().items() if t.is_meta]
        if missing:
            raise ValueError(f"checkpoint lacks weights for: {', '.join(missing[:5])}")
        if torch.device(device).type != "cpu":  # a GPU library's kernel may depend on the row count
            pad_short_passes(model)
        if torch.device(device).type == "cuda" and graphs_wanted():
            model.graphs = exact_graphs(cfg, max_len or cfg.max_position_embeddings, device, dtype)
        return model.eval()


Source = Callable[[dict[str, torch.Tensor]], torch.Tensor]  # a module's tensor, from a Hugging Face state dict


def hf_sources(cfg: ModelConfig) -> dict[str, Source]:
    """Each of the model's tensors (its own names) as read from a Hugging Face state dict: the names of Llama, Qwen,
    Mistral, Gemma 3 (whose post_attention_layernorm is the sandwich norm after attention, pre_feedforward_layernorm
    the pre-MLP norm) and Phi-3 (qkv_proj and gate_up_proj stored fused)."""
    def take(name: str) -> Source:
        return lambda sd: sd[name]

    def fused(fused_name: str, parts: list[str]) -> Source:
        return lambda sd: sd[fused_name] if fused_name in sd else torch.cat([sd[n] for n in parts])

    def norm(name: str) -> Source:  # the offset folded in fp32, as HF adds it, before the cast to the model's dtype
        if cfg.norm_offset == 0.0:
            return take(name)
        return lambda sd: sd[name].float() + cfg.norm_offset

    out: dict[str, Source] = {"embed.weight": take("model.embed_tokens.weight"),
                              "norm.weight": norm("model.norm.weight")}
    if not cfg.tie_word_embeddings:
        out["lm_head.weight"] = take("lm_head.weight")
    for i in range(cfg.num_layers):
        p, own = f"model.layers.{i}.", f"layers.{i}."
        a, m = p + "self_attn.", p + "mlp."
        out[own + "attn_norm.weight"] = norm(p + "input_layernorm.weight")
        if cfg.sandwich_norm:
            out[own + "attn_post_norm.weight"] = norm(p + "post_attention_layernorm.weight")
            out[own + "mlp_norm.weight"] = norm(p + "pre_feedforward_layernorm.weight")
            out[own + "mlp_post_norm.weight"] = norm(p + "post_feedforward_layernorm.weight")
        else:
            out[own + "mlp_norm.weight"] = norm(p + "post_attention_layernorm.weight")
        out[own + "attn.qkv.weight"] = fused(a + "qkv_proj.weight", [a + f"{n}_proj.weight" for n in "qkv"])
        if cfg.attention_bias:
            out[own + "attn.qkv.bias"] = fused(a + "qkv_proj.bias", [a + f"{n}_proj.bias" for n in "qkv"])
        if cfg.qk_norm:
            out[own + "attn.q_norm.weight"] = norm(a + "q_norm.weight")
            out[own + "attn.k_norm.weight"] = norm(a + "k_norm.weight")
        out[own + "attn.o.weight"] = take(a + "o_proj.weight")
        out[own + "mlp.gate_up.weight"] = fused(m + "gate_up_proj.weight",
                                                [m + "gate_proj.weight", m + "up_proj.weight"])
        out[own + "mlp.down.weight"] = take(m + "down_proj.weight")
    return out
