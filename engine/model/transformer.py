"""A Llama-family decoder (Llama 3.x, Qwen2) for batch size 1 over a paged KV cache.

q/k/v and gate/up are fused into one matmul each: fewer, larger kernels run faster at decode time.
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


Angles = tuple[torch.Tensor, torch.Tensor]  # cos and the signed sin at a pass's positions, each (T, 1, D)


def rope_frequencies(cfg: ModelConfig) -> torch.Tensor:
    """Inverse frequencies (D/2,), with Llama 3's long-context rescaling when configured."""
    d = cfg.head_dim
    # fp32 throughout, the way the reference implementation rounds: angles at long positions amplify ulps.
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    rs = cfg.rope_scaling
    if rs and rs.get("rope_type", rs.get("type")) == "llama3":
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
    def __init__(self, cfg: ModelConfig, max_len: int) -> None:
        super().__init__()
        t = torch.arange(max_len, dtype=torch.float32)
        freqs = torch.outer(t, rope_frequencies(cfg))  # (P, D/2)
        emb = torch.cat([freqs, freqs], dim=-1)  # (P, D)
        self.register_buffer("cos", emb.cos(), persistent=False)
        self.register_buffer("sin", emb.sin(), persistent=False)

    def at(self, pos: slice | torch.Tensor, dtype: torch.dtype) -> Angles:
        """cos and sin at positions pos (a slice, or a (T,) tensor inside a CUDA graph), each (T, 1, D) in dtype,
        sin's first half negated (see rotate). Made once per pass: every layer rotates by the same angles."""
        cos = self.cos[pos].unsqueeze(1).to(dtype)  # (T, 1, D)
        sin = self.sin[pos].unsqueeze(1).to(dtype)
        half = sin.shape[-1] // 2
        return cos, torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)


def rotate(x: torch.Tensor, angles: Angles) -> torch.Tensor:
    """Rotate x (T, H, D) by Rotary.at's angles: x cos + (-x2, x1) sin, where (-x2, x1) sin is x rolled by half
    times the signed sin, the same products in one kernel fewer."""
    cos, signed_sin = angles
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


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
        self.qkv = Linear(cfg.hidden_size, (self.h + 2 * self.hkv) * self.d, bias=cfg.attention_bias)
        self.o = Linear(self.h * self.d, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor, angles: Angles, cache: CacheView | SlotView) -> torch.Tensor:
        T, qk_width = x.shape[0], (self.h + self.hkv) * self.d
        qkv = self.qkv(x)  # (T, (H + 2 Hkv) D)
        # q and k rotated in one go: half the elementwise kernels, each a launch that a GPU step waits on
        qk = rotate(qkv[:, :qk_width].view(T, self.h + self.hkv, self.d), angles)  # (T, H + Hkv, D)
        q, k = qk[:, : self.h], qk[:, self.h :]  # (T, H, D), (T, Hkv, D)
        keys, values = cache.update(self.layer, k, qkv[:, qk_width:].view(T, self.hkv, self.d))  # (Hkv, S, D)
        return self.o(cache.attend(q, keys, values))  # (T, C)


class MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.inter = cfg.intermediate_size
        self.gate_up = Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x).split(self.inter, dim=-1)
        return self.down(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.attn = Attention(cfg, layer)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, angles: Angles, cache: CacheView | SlotView) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), angles, cache)
        return x + self.mlp(self.mlp_norm(x))


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
        if self.stack is not None and len(ids) <= ROW_WISE_MAX:
            x = self.stack(x, cache.end - len(ids), cache)  # (T, C), normed
        else:
            angles = self.rope.at(cache.positions, x.dtype)
            for block in self.layers:
                x = block(x, angles, cache)
            x = self.norm(x)
        if last_only:
            x = x[-1:]
        return self.lm_head(x).float()  # (T, V), or (T, len(head))

    @classmethod
    def from_state_dict(
        cls, cfg: ModelConfig, sd: dict[str, torch.Tensor], dtype: torch.dtype, device: str | torch.device,
        max_len: int | None = None,
    ) -> Transformer:
        """Build from Hugging Face tensor names, fusing q/k/v and gate/up as we go; on a GPU, short passes are
        padded to one row count where the kernels need it (engine.model.row_padding)."""
        model = cls(cfg, max_len)
        own: dict[str, torch.Tensor] = {
            "embed.weight": sd["model.embed_tokens.weight"],
            "norm.weight": sd["model.norm.weight"],
        }
        if not cfg.tie_word_embeddings:
            own["lm_head.weight"] = sd["lm_head.weight"]
        for i in range(cfg.num_layers):
            p = f"model.layers.{i}."
            a = p + "self_attn."
            own[f"layers.{i}.attn_norm.weight"] = sd[p + "input_layernorm.weight"]
            own[f"layers.{i}.mlp_norm.weight"] = sd[p + "post_attention_layernorm.weight"]
            own[f"layers.{i}.attn.qkv.weight"] = torch.cat([sd[a + f"{n}_proj.weight"] for n in "qkv"])
            if cfg.attention_bias:
                own[f"layers.{i}.attn.qkv.bias"] = torch.cat([sd[a + f"{n}_proj.bias"] for n in "qkv"])
            own[f"layers.{i}.attn.o.weight"] = sd[a + "o_proj.weight"]
            m = p + "mlp."
            own[f"layers.{i}.mlp.gate_up.weight"] = torch.cat([sd[m + "gate_proj.weight"], sd[m + "up_proj.weight"]])
            own[f"layers.{i}.mlp.down.weight"] = sd[m + "down_proj.weight"]
        own = {k: v.to(device=device, dtype=dtype) for k, v in own.items()}
        model.load_state_dict(own, strict=False, assign=True)
        if cfg.tie_word_embeddings:
            model.lm_head.weight = model.embed.weight
        model.rope.to(device)
        missing = [n for n, t in model.state_dict().items() if t.is_meta]
        if missing:
            raise ValueError(f"checkpoint lacks weights for: {', '.join(missing[:5])}")
        if torch.device(device).type != "cpu":  # a GPU library's kernel may depend on the row count
            pad_short_passes(model)
        if torch.device(device).type == "cuda" and graphs_wanted():
            model.graphs = exact_graphs(cfg, max_len or cfg.max_position_embeddings, device, dtype)
        return model.eval()
