"""Configs, each checked when it is made."""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from typing import Any, Literal, get_args

from engine.model import families

Activation = Literal["silu", "gelu_tanh"]  # the gated MLP's act(gate) * up


@dataclass(frozen=True)
class ModelConfig:
    """A decoder of a family the engine runs (engine.model.families). The defaults are Llama's math; each further
    field is one feature of a family's row, read by the one decoder (engine.model.transformer)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int = 0  # 0: hidden_size // num_heads
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    # {"rope_type": "llama3" | "linear" | "longrope", ...}: the global layers' scaling. A longrope dict holds its
    # short_factor, original_max_position_embeddings and the resolved attention_factor (from_hf fills it in).
    rope_scaling: dict[str, Any] | None = None
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    attention_bias: bool = False  # Qwen2 has q/k/v biases
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    arch: str = "llama"
    # Gemma stores w and scales by (1 + w): loaders fold the offset into the weights (w + offset in fp32), so the
    # passes only ever compute w * x_hat. A GGUF's norms already hold the sum (llama.cpp adds it): 0.0 there.
    norm_offset: float = 0.0
    qk_norm: bool = False  # per-head RMSNorm on q and k after the projection, before RoPE (Qwen3, Gemma 3)
    activation: Activation = "silu"
    embedding_scale: float = 1.0  # embeddings times this, rounded to the weights' dtype (Gemma: sqrt(hidden_size))
    sandwich_norm: bool = False  # a second norm on each sublayer's output before the residual add (Gemma 3)
    # The attention window: a query at position p sees keys p - W + 1 .. p in the layers window_layers marks
    # (one flag per layer; empty: no layer is windowed).
    sliding_window: int | None = None
    window_layers: tuple[bool, ...] = ()
    rope_local_theta: float | None = None  # the windowed layers' RoPE base (Gemma 3); None: rope_theta everywhere
    rotary_dim: int = 0  # 0: head_dim; else RoPE turns the first rotary_dim dims of each head, the rest pass
    attn_scale: float = 0.0  # 0: 1/sqrt(head_dim); Gemma 3: query_pre_attn_scalar ** -0.5
    # One flag per layer: it attends without RoPE (SmolLM3's NoPE layers); empty: every layer rotates
    nope_layers: tuple[bool, ...] = ()
    residual_scale: float = 1.0  # each sublayer's output times this before it joins the residual (Granite)
    logit_scale: float = 1.0  # the LM head's logits divided by this (Granite's logits_scaling)

    def __post_init__(self) -> None:
        if self.head_dim == 0:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_heads)
        if self.rotary_dim == 0:
            object.__setattr__(self, "rotary_dim", self.head_dim)
        if self.attn_scale == 0.0:
            object.__setattr__(self, "attn_scale", 1.0 / math.sqrt(self.head_dim))
        object.__setattr__(self, "window_layers", tuple(bool(w) for w in self.window_layers))
        nope = tuple(bool(w) for w in self.nope_layers)
        object.__setattr__(self, "nope_layers", nope if any(nope) else ())  # no NoPE layer: one way to say it
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads"):
            if getattr(self, name) < 1:
                raise ValueError(f"ModelConfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if not (0 < self.rotary_dim <= self.head_dim and self.rotary_dim % 2 == 0):
            raise ValueError(f"rotary_dim must be even and in (0, head_dim = {self.head_dim}], got {self.rotary_dim}")
        if self.activation not in get_args(Activation):
            raise ValueError(f"activation must be one of {get_args(Activation)}, got {self.activation!r}")
        for name in ("norm_offset", "embedding_scale", "attn_scale", "residual_scale", "logit_scale"):
            _check_finite(type(self).__name__, name, getattr(self, name))
        for name in ("embedding_scale", "attn_scale", "residual_scale", "logit_scale"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.nope_layers and len(self.nope_layers) != self.num_layers:
            raise ValueError(f"nope_layers has {len(self.nope_layers)} flags for {self.num_layers} layers")
        if self.rope_local_theta is not None and not self.rope_local_theta > 0:
            raise ValueError(f"rope_local_theta must be > 0, got {self.rope_local_theta}")
        if self.window_layers and len(self.window_layers) != self.num_layers:
            raise ValueError(f"window_layers has {len(self.window_layers)} flags for {self.num_layers} layers")
        if any(self.window_layers) and self.sliding_window is None:
            raise ValueError("window_layers marks windowed layers but sliding_window is not set")
        if self.sliding_window is not None:
            _check_int(type(self).__name__, "sliding_window", self.sliding_window)
            if self.sliding_window < 1:
                raise ValueError(f"sliding_window must be >= 1, got {self.sliding_window}")
        if self.rope_scaling is not None:
            kind = self.rope_scaling.get("rope_type", self.rope_scaling.get("type"))
            kind = families.ROPE_ALIASES.get(kind, kind)
            object.__setattr__(self, "rope_scaling", {**self.rope_scaling, "rope_type": kind})  # one name per kind
            if kind not in ("default", None) and kind not in families.ROPE_SCALINGS:
                raise ValueError(f"unsupported rope_scaling type {kind!r} (supported: "
                                 f"{', '.join(families.ROPE_SCALINGS)})")
            if kind == "longrope":
                self._check_longrope()
            if kind == "linear":
                factor = self.rope_scaling.get("factor")
                if isinstance(factor, bool) or not isinstance(factor, (int, float)) or not factor > 0:
                    raise ValueError(f"linear rope_scaling needs a positive factor, got {factor!r}")

    def _check_longrope(self) -> None:
        rs = self.rope_scaling
        short, orig = rs.get("short_factor"), rs.get("original_max_position_embeddings")
        if not isinstance(short, (list, tuple)) or len(short) != self.rotary_dim // 2 or not all(
                isinstance(f, (int, float)) and not isinstance(f, bool) and f > 0 for f in short):
            raise ValueError(f"longrope short_factor must list {self.rotary_dim // 2} positive factors (one per "
                             f"rotary frequency), got {short!r}")
        if not isinstance(orig, int) or orig < 1:
            raise ValueError(f"longrope needs original_max_position_embeddings, got {orig!r}")
        if self.max_position_embeddings > orig:
            # Past it HF switches every position's angles to long_factor: a sequence's earlier positions would
            # then be rotated differently from when they were cached, so the engine stays within it.
            raise ValueError(f"a context of {self.max_position_embeddings} tokens is longer than the "
                             f"{orig} tokens up to which LongRoPE uses its short factors")

    @property
    def rotated(self) -> tuple[bool, ...]:
        """One flag per layer: whether it turns q and k by RoPE."""
        return tuple(not n for n in self.nope_layers) or (True,) * self.num_layers

    @property
    def windowed(self) -> tuple[bool, ...]:
        """One flag per layer: whether it attends through the sliding window."""
        return self.window_layers or (False,) * self.num_layers

    @property
    def context_note(self) -> str:
        """Why the context is shorter than the model was trained for, for the load info; "" when it is not."""
        rs = self.rope_scaling or {}
        if rs.get("rope_type") == "longrope" and rs.get("max_position_embeddings", 0) > self.max_position_embeddings:
            return (f"context capped at {self.max_position_embeddings} tokens, where LongRoPE's short factors end: "
                    "past it the model rotates every position by its long factors, which SpecLens does not run")
        return ""

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> ModelConfig:
        """From a Hugging Face config.json dict; a family or field the engine does not compute is refused by name
        (engine.model.families)."""
        fam = families.check_hf_config(cfg)
        cfg = {**families.hf_defaults(fam), **cfg}
        context = cfg.get("max_position_embeddings", 4096)
        windowed = families.window_layers(fam, cfg)
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        rotary_dim = int(head_dim * families.partial_rotary_factor(cfg)) if fam.partial_rotary else head_dim
        rope_global, rope_local = families.rope_parameters(fam, cfg)
        scaling = _rope_scaling(rope_global, cfg, context)
        if scaling and scaling["rope_type"] == "longrope":  # see _check_longrope
            context = min(context, scaling["original_max_position_embeddings"])
        act = cfg.get("hidden_activation") or cfg.get("hidden_act") or "silu"
        scalar = cfg.get("query_pre_attn_scalar")
        scaled = "multipliers" in fam.extra  # Granite: the four scalars stated in config.json
        if scaled:
            embedding_scale, attn_scale = cfg["embedding_multiplier"], cfg["attention_multiplier"]
        else:
            embedding_scale = math.sqrt(cfg["hidden_size"]) if fam.embedding_scale else 1.0
            attn_scale = scalar ** -0.5 if scalar else 0.0
        return cls(
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=cfg["num_attention_heads"],
            num_kv_heads=cfg.get("num_key_value_heads") or cfg["num_attention_heads"],
            head_dim=head_dim,
            rms_norm_eps=cfg.get("rms_norm_eps", 1e-5),
            rope_theta=rope_global.get("rope_theta", 10000.0),
            rope_scaling=scaling,
            max_position_embeddings=context,
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=fam.qkv_bias == "always" or (fam.qkv_bias == "config" and bool(cfg.get("attention_bias"))),
            bos_token_id=cfg.get("bos_token_id"),
            eos_token_ids=eos_ids,
            arch=fam.model_type,
            norm_offset=fam.norm_offset,
            qk_norm=fam.qk_norm,
            activation="silu" if act == "silu" else "gelu_tanh",
            embedding_scale=embedding_scale,
            sandwich_norm="sandwich_norm" in fam.extra,
            sliding_window=cfg.get("sliding_window") if any(windowed) else None,
            window_layers=windowed if any(windowed) else (),
            rope_local_theta=rope_local.get("rope_theta") if rope_local is not None else None,
            rotary_dim=rotary_dim,
            attn_scale=attn_scale,
            nope_layers=families.nope_layers(fam, cfg),
            residual_scale=cfg["residual_multiplier"] if scaled else 1.0,
            logit_scale=cfg["logits_scaling"] if scaled else 1.0,
        )


def _rope_scaling(rs: dict[str, Any], cfg: dict[str, Any], context: int) -> dict[str, Any] | None:
    """The global layers' rope_scaling, as the engine reads it; None for plain RoPE. A longrope dict gets its
    original context and attention factor resolved as transformers resolves them."""
    kind = rs.get("rope_type", rs.get("type"))
    if kind in (None, "default"):
        return None
    out = {k: v for k, v in rs.items() if k not in ("type", "rope_theta", "partial_rotary_factor")}
    out["rope_type"] = "longrope" if kind == "su" else kind
    if out["rope_type"] != "longrope":
        return out
    orig = rs.get("original_max_position_embeddings") or cfg.get("original_max_position_embeddings") or context
    factor = rs.get("factor") or context / orig
    attention = rs.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(orig))
    out |= {"original_max_position_embeddings": orig, "attention_factor": float(attention),
            "max_position_embeddings": context}
    return out


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen. Applied identically to draft and target (Leviathan §2.2)."""

    temperature: float = 0.0  # 0: greedy
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    repetition_penalty: float = 1.0  # 1: off
    max_new_tokens: int = 256
    seed: int | None = None
    stop: tuple[str, ...] = ()  # a single str is taken as one stop string

    def __post_init__(self) -> None:
        for name in ("temperature", "top_p", "repetition_penalty"):
            _check_finite(type(self).__name__, name, getattr(self, name))
        for name in ("top_k", "max_new_tokens"):
            _check_int(type(self).__name__, name, getattr(self, name))
        if not (0.0 <= self.temperature <= 10.0):
            raise ValueError(f"temperature must be in [0, 10], got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not (0.0 < self.top_p <= 1.0):
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.seed is not None:
            _check_int(type(self).__name__, "seed", self.seed)
            if not 0 <= self.seed < 2**64:  # what torch.Generator.manual_seed takes
                raise ValueError(f"seed must be in [0, 2**64), got {self.seed}")
        object.__setattr__(self, "stop", _stop_strings(self.stop))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def with_(self, **kw: Any) -> SamplingParams:
        return replace(self, **kw)


def _check_finite(owner: str, name: str, value: object) -> None:
    """NaN slips through every range comparison, so non-finite values are refused first."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{owner}.{name} must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{owner}.{name} must be a finite number, got {value!r}")


def _check_int(owner: str, name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ValueError(f"{owner}.{name} must be an integer, got {value!r}")


def _stop_strings(stop: str | tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """A single string is one stop string (iterating it would make every character a stop)."""
    items = (stop,) if isinstance(stop, str) else stop
    try:
        items = tuple(items)
    except TypeError:
        raise ValueError(f"stop must be a string or a sequence of strings, got {stop!r}") from None
    bad = [s for s in items if not isinstance(s, str)]
    if bad:
        raise ValueError(f"stop strings must be str, got {bad[0]!r}")
    return tuple(s for s in items if s)


# hybrid: each round the draft model, the n-gram lookup or no draft, whichever pays most (engine/spec/policy.py)
Drafter = Literal["model", "ngram", "hybrid"]
DRAFTERS: tuple[str, ...] = get_args(Drafter)
NEEDS_DRAFT_MODEL = ("model", "hybrid")  # the drafters that cannot run without a draft model


# The most draft tokens a round may ask for: each costs a verify position and an inspector row, and acceptance
# of the i-th draft falls as alpha^i, so far beyond this no drafter gains. The app offers 1-16.
K_LIMIT = 64


@dataclass(frozen=True)
class SpecParams:
    """How each round drafts. Read at the start of every round, so it may change mid-request."""

    enabled: bool = True
    k: int = 4
    drafter: Drafter = "model"
    adaptive: bool = False  # pick K each round from recent acceptance
    k_max: int = 16
    ngram_max: int = 4  # longest context the n-gram drafter matches
    ngram_min: int = 1
    # The draft model stops a round's drafting early once the product of its confidences in its tokens falls
    # below this (engine.spec.drafters.confidence); 0 always drafts K. Lossless either way. The app uses STOP_BELOW.
    stop_below: float = 0.0

    def __post_init__(self) -> None:
        for name in ("enabled", "adaptive"):  # a string such as "no" would count as on
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"SpecParams.{name} must be True or False, got {getattr(self, name)!r}")
        for name in ("k", "k_max", "ngram_max", "ngram_min"):
            _check_int(type(self).__name__, name, getattr(self, name))
        _check_finite(type(self).__name__, "stop_below", self.stop_below)
        if not 0.0 <= self.stop_below < 1.0:
            raise ValueError(f"stop_below must be in [0, 1), got {self.stop_below}")
        if self.k < 1:
            raise ValueError(f"K must be >= 1, got {self.k}")
        if not 1 <= self.k_max <= K_LIMIT:
            raise ValueError(f"SpecParams.k_max must be in [1, {K_LIMIT}], got {self.k_max}")
        if self.k > self.k_max:
            raise ValueError(f"K must be <= {self.k_max}, got {self.k}")
        if self.drafter not in DRAFTERS:
            raise ValueError(f"drafter must be one of {', '.join(map(repr, DRAFTERS))}, got {self.drafter!r}")
        if not (1 <= self.ngram_min <= self.ngram_max):
            raise ValueError(f"need 1 <= ngram_min <= ngram_max, got {self.ngram_min}, {self.ngram_max}")

    def with_(self, **kw: Any) -> SpecParams:
        return replace(self, **kw)


# Measured on the embedded pair (2-core AVX2 CPU, greedy, 4 bench prompts, decode rates): with it K = 4 ran 1.19x
# plain instead of 1.06x and K = 6 1.13x instead of 0.93x, while K = 2 stayed at ~1.15x; 0.5 did worse at K >= 3,
# 0.8 and 0.9 no better. So a K set too high costs little.
STOP_BELOW = 0.7


@dataclass(frozen=True)
class AppDefaults:
    """What the app runs before anyone changes a control, and what `speclens-bench --modes default` runs: one
    definition, so the benchmark's "default" is the app's."""

    speculative: bool = True
    # The fastest mode in the latest runs on Zen 4, Zen 5 and an Intel Xeon and in two of three on Zen 3 (README
    # "Performance"): the n-gram lookup where the reply copies its context, the draft model elsewhere.
    drafter: Drafter = "hybrid"
    # With the early stop on, K is a ceiling: on a 2-vCPU AVX2 machine the embedded pair ran 1.18-1.19x plain at
    # K = 2, 4 and 6 alike (scripts/bench/cpu.py; see the README), where fixed K peaks at 1-2 and falls off after.
    # 4 leaves room for text that repeats.
    k: int = 4
    k_max: int = 16  # the K slider's top
    adaptive: bool = False
    stop_below: float = STOP_BELOW
    temperature: float = 0.0  # greedy: the reply is then identical with and without speculation
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 1024  # a coding answer with its explanation fits (256 cut them mid-function)
    seed: int | None = None  # a new one per reply

    def __post_init__(self) -> None:
        self.spec_params(), self.sampling_params()  # checked as the engine would check them

    def spec_params(self) -> SpecParams:
        return SpecParams(enabled=self.speculative, k=self.k, drafter=self.drafter, adaptive=self.adaptive,
                          k_max=self.k_max, stop_below=self.stop_below)

    def sampling_params(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                              max_new_tokens=self.max_new_tokens, seed=self.seed)


APP_DEFAULTS = AppDefaults()


# The KV cache's length when nothing else is asked for: the embedded pair's caches then take ~0.17 GB (float16, as
# GGUF models keep them), well within the app's 2.5 GB budget; its target allows 32k tokens (~1.3 GB), a setting away.
DEFAULT_CONTEXT = 4096
# Bytes a cached K or V value takes on the CPU: a GGUF model's cache is float16 (engine.io.gguf_model), others float32
GGUF_KV_BYTES, DENSE_KV_BYTES = 2, 4


@dataclass(frozen=True)
class CacheConfig:
    block_size: int = 16
    num_blocks: int = 0  # 0: enough for max_seq_len plus K slack
    max_seq_len: int = 4096

    def __post_init__(self) -> None:
        for name in ("block_size", "num_blocks", "max_seq_len"):
            _check_int(type(self).__name__, name, getattr(self, name))
        if self.block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {self.block_size}")
        if self.max_seq_len < 2:
            raise ValueError(f"max_seq_len must be >= 2, got {self.max_seq_len}")
        if self.num_blocks < 0:
            raise ValueError(f"num_blocks must be >= 0, got {self.num_blocks}")

    @property
    def blocks(self) -> int:
        return self.num_blocks or -(-(self.max_seq_len + 32) // self.block_size)


