"""Model families as data: each architecture is a row of the features its math uses.

The engine (engine.model.transformer) is one decoder: RMSNorm (its weights offset at load where a family stores
w - 1), RoPE (plain, Llama 3, linear or LongRoPE scaled, on whole heads or part of each), grouped-query attention with
optional q/k/v biases, per-head q/k norms and a sliding window on chosen layers (with their own RoPE base), a SiLU- or
GELU(tanh)-gated MLP, optional sandwich norms, layers without RoPE (NoPE), a scaled embedding, scaled residual
branches and logits (Granite's multipliers) and an optional tied head. A family runs when
every feature of its row is one the engine implements; otherwise it is refused by name, with the features it lacks,
before any weight is read. Adding a family is adding a row (and, when it needs one, implementing a feature), never
a path.

Both readers consult this table: the Hugging Face config.json path (engine.api.config.ModelConfig.from_hf, by
model_type) and the GGUF path (engine.io.gguf_config, by general.architecture, as llama.cpp names it; what a GGUF's
keys and tensors add is judged in engine.model.gguf_refusal).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal


@dataclass(frozen=True)
class Feature:
    key: str
    phrase: str  # how a refusal names it: "<Family> needs <phrase>, which SpecLens does not implement yet"
    implemented: bool


_FEATURES = (
    Feature("rms_norm", "RMSNorm", True),
    Feature("norm_offset", "RMSNorm scaled by (1 + weight)", True),
    Feature("qk_norm", "per-head q/k RMSNorm", True),
    Feature("qkv_bias", "q/k/v projection biases", True),
    Feature("o_bias", "an output-projection (o_proj) bias", False),
    Feature("mlp_bias", "MLP biases", False),
    Feature("silu", "a SiLU-gated MLP", True),
    Feature("gelu", "a GELU-gated MLP", True),
    Feature("sliding_window", "sliding-window attention", True),
    Feature("embedding_scale", "embeddings scaled by sqrt(hidden_size)", True),
    Feature("tied_head", "an LM head tied to the embedding", True),
    Feature("logit_softcap", "logit soft-capping", False),
    Feature("partial_rotary", "RoPE on part of each head (partial_rotary_factor < 1)", True),
    Feature("rope_llama3", "Llama 3 RoPE scaling", True),
    Feature("rope_linear", "linear RoPE scaling", True),
    Feature("rope_dynamic", "dynamic NTK RoPE scaling", False),
    Feature("rope_yarn", "YaRN RoPE scaling", False),
    # Exact by capping the context at original_max_position_embeddings, within which HF uses the short factors
    Feature("rope_longrope", "LongRoPE scaling", True),
    Feature("fused_qkv", "fused qkv_proj/gate_up_proj weights", True),
    Feature("sandwich_norm", "sandwich norms (a second norm after each sublayer)", True),
    Feature("local_rope", "a separate RoPE base for its sliding-window layers", True),
    Feature("nope_layers", "layers without RoPE (NoPE)", True),
    Feature("multipliers", "scaling multipliers (embedding/attention/residual/logit)", True),
    Feature("moe", "mixture-of-experts layers", False),
)
FEATURES: dict[str, Feature] = {f.key: f for f in _FEATURES}

# rope_scaling kind (config.json's rope_type) -> feature; "default" is plain RoPE
ROPE_KINDS = {"llama3": "rope_llama3", "linear": "rope_linear", "dynamic": "rope_dynamic", "yarn": "rope_yarn",
              "longrope": "rope_longrope", "su": "rope_longrope"}
ROPE_ALIASES = {"su": "longrope"}  # older configs' names
# what the engine runs, by their current names
ROPE_SCALINGS = tuple(kind for kind, key in ROPE_KINDS.items()
                      if FEATURES[key].implemented and kind not in ROPE_ALIASES)

Choice = Literal["never", "always", "config"]  # a bias the family never has, always has, or takes from config.json
# no window; every layer when sliding_window is set (Mistral, Phi-3); the layers layer_types or max_window_layers mark,
# with use_sliding_window (Qwen); the layers layer_types or sliding_window_pattern mark (Gemma 3)
Window = Literal["none", "all", "layers", "pattern"]


@dataclass(frozen=True)
class Family:
    model_type: str  # config.json's model_type
    title: str  # for messages
    gguf_arch: str | None  # llama.cpp's general.architecture; None: llama.cpp writes it as another (Mistral: llama)
    norm: Literal["rms"] = "rms"
    norm_offset: float = 0.0  # Gemma stores w - 1 and scales by (1 + w)
    qk_norm: bool = False
    qkv_bias: Choice = "never"
    o_bias: Choice = "never"  # Llama's attention_bias also puts a bias on o_proj
    mlp_bias: Choice = "never"
    activation: str = "silu"
    window: Window = "none"
    embedding_scale: bool = False
    logit_softcap: bool = False
    partial_rotary: bool = False  # RoPE on part of each head where config.json says so (partial_rotary_factor)
    rope_scaling: tuple[str, ...] = ()  # the rope_type kinds its published checkpoints use
    extra: tuple[str, ...] = ()  # further feature keys of its math
    # config.json fields the family's transformers config defaults when a file leaves them out
    hf_defaults: tuple[tuple[str, Any], ...] = ()
    # NoPE layers in a GGUF, which states none: every nope_step-th layer, as llama.cpp hard-codes for the arch
    nope_step: int = 0
    # llama.cpp's converter interleaves the two rotary halves of each q and k head (its LlamaModel and heirs); the
    # GGUF reader undoes it
    gguf_qk_interleaved: bool = False

    def __post_init__(self) -> None:
        unknown = [k for k in (*self.extra, *(ROPE_KINDS[r] for r in self.rope_scaling)) if k not in FEATURES]
        if unknown:
            raise ValueError(f"family {self.model_type}: unknown feature(s) {unknown}")

    @property
    def features(self) -> tuple[str, ...]:
        """Every feature its math needs whatever the config says (a config may add more: see check_hf_config)."""
        out = [self.norm + "_norm"]
        out += ["norm_offset"] * (self.norm_offset != 0.0) + ["qk_norm"] * self.qk_norm
        out += ["qkv_bias"] * (self.qkv_bias == "always") + ["o_bias"] * (self.o_bias == "always")
        out += ["mlp_bias"] * (self.mlp_bias == "always")
        out += ["silu" if self.activation == "silu" else "gelu"]
        out += ["sliding_window"] * (self.window != "none") + ["embedding_scale"] * self.embedding_scale
        out += ["logit_softcap"] * self.logit_softcap + ["partial_rotary"] * self.partial_rotary
        out += [ROPE_KINDS[r] for r in self.rope_scaling] + list(self.extra)
        return tuple(dict.fromkeys(out))

    @property
    def missing(self) -> tuple[Feature, ...]:
        return tuple(FEATURES[k] for k in self.features if not FEATURES[k].implemented)

    @property
    def runnable(self) -> bool:
        return not self.missing

    def refusal(self) -> str | None:
        """Why SpecLens cannot run this family, in a sentence; None when it can."""
        if self.runnable:
            return None
        return f"{self.title} needs {phrases([f.phrase for f in self.missing])}, which SpecLens does not implement yet"


FAMILIES: tuple[Family, ...] = (
    Family("llama", "Llama", "llama", qkv_bias="config", o_bias="config", mlp_bias="config", rope_scaling=("llama3",),
           gguf_qk_interleaved=True, hf_defaults=(("rms_norm_eps", 1e-6), ("max_position_embeddings", 2048))),
    Family("qwen2", "Qwen2", "qwen2", qkv_bias="always", window="layers",
           hf_defaults=(("rms_norm_eps", 1e-6), ("max_position_embeddings", 32768), ("sliding_window", 4096))),
    Family("mistral", "Mistral", None, window="all",
           hf_defaults=(("rms_norm_eps", 1e-6), ("max_position_embeddings", 131_072), ("sliding_window", 4096))),
    Family("qwen3", "Qwen3", "qwen3", qk_norm=True, qkv_bias="config", o_bias="config", window="layers",
           hf_defaults=(("rms_norm_eps", 1e-6), ("head_dim", 128), ("max_position_embeddings", 32768),
                        ("sliding_window", 4096))),
    Family("gemma3_text", "Gemma 3", "gemma3", norm_offset=1.0, qk_norm=True, qkv_bias="config", o_bias="config",
           activation="gelu_pytorch_tanh", window="pattern", embedding_scale=True, rope_scaling=("linear",),
           extra=("sandwich_norm", "local_rope"),
           hf_defaults=(("hidden_activation", "gelu_pytorch_tanh"), ("rms_norm_eps", 1e-6), ("head_dim", 256),
                        ("rope_theta", 1_000_000.0), ("rope_local_base_freq", 10_000.0),
                        ("query_pre_attn_scalar", 256), ("sliding_window", 4096), ("sliding_window_pattern", 6),
                        ("max_position_embeddings", 131_072), ("tie_word_embeddings", True))),
    Family("phi3", "Phi-3", "phi3", window="all", partial_rotary=True, rope_scaling=("longrope",),
           extra=("fused_qkv",), hf_defaults=(("rms_norm_eps", 1e-5), ("max_position_embeddings", 4096))),
    Family("smollm3", "SmolLM3", "smollm3", qkv_bias="config", o_bias="config", mlp_bias="config",
           extra=("nope_layers",), nope_step=4, gguf_qk_interleaved=True,
           hf_defaults=(("rms_norm_eps", 1e-6), ("max_position_embeddings", 32768), ("rope_theta", 2_000_000.0),
                        ("tie_word_embeddings", True))),
    # Granite 3.x: a Llama with four scalars (embedding, attention, residual and logit multipliers)
    Family("granite", "Granite", "granite", qkv_bias="config", o_bias="config", mlp_bias="config",
           extra=("multipliers",), gguf_qk_interleaved=True,
           hf_defaults=(("rms_norm_eps", 1e-6), ("max_position_embeddings", 2048), ("embedding_multiplier", 1.0),
                        ("attention_multiplier", 1.0), ("residual_multiplier", 1.0), ("logits_scaling", 1.0))),
    # Named so that a refusal says which family and what it lacks, rather than "unsupported model_type"
    Family("gemma2", "Gemma 2", "gemma2", norm_offset=1.0, activation="gelu_pytorch_tanh", window="pattern",
           embedding_scale=True, logit_softcap=True, extra=("sandwich_norm",)),
    Family("qwen3_moe", "Qwen3 MoE", "qwen3moe", qk_norm=True, window="layers", extra=("moe",)),
)
BY_MODEL_TYPE: dict[str, Family] = {f.model_type: f for f in FAMILIES} | {"gemma3": FAMILIES[4]}
BY_GGUF_ARCH: dict[str, Family] = {f.gguf_arch: f for f in FAMILIES if f.gguf_arch}


def runnable_names(gguf: bool = False) -> list[str]:
    return [(f.gguf_arch if gguf else f.model_type) for f in FAMILIES if f.runnable and (f.gguf_arch or not gguf)]


def family_of(cfg: Mapping[str, Any]) -> Family:
    """The row for a config.json; ValueError naming the family when it is unknown or not runnable."""
    arch = cfg.get("model_type", "llama")
    fam = BY_MODEL_TYPE.get(arch)
    if fam is None:
        raise ValueError(f"unsupported model_type {arch!r}: SpecLens runs {', '.join(runnable_names())}")
    if (why := fam.refusal()) is not None:
        raise ValueError(why)
    return fam


# The MLP activations transformers names in config.json, by what the engine computes for each
HF_ACTIVATIONS = {"silu": "silu", "gelu_pytorch_tanh": "gelu_tanh"}


def check_hf_config(cfg: Mapping[str, Any]) -> Family:
    """The family of a config.json, once every field that would change the math is one the engine computes.

    A field a family's own code ignores (Mistral's attention_bias) is not refused: transformers ignores it too."""
    vision = isinstance(cfg.get("text_config"), Mapping)
    if vision:
        raise ValueError(f"a {cfg.get('model_type', 'multimodal')!r} folder holds a vision-language model; SpecLens "
                         "runs text-only checkpoints (for Gemma 3: model_type 'gemma3_text')")
    fam = family_of(cfg)
    # the field the family's transformers code reads (Gemma: hidden_activation), and any other one the file sets
    used = "hidden_activation" if fam.activation != "silu" else "hidden_act"
    for key in dict.fromkeys((used, "hidden_act", "hidden_activation")):
        act = cfg.get(key, fam.activation if key == used else None)
        if act is not None and act not in HF_ACTIVATIONS:
            raise ValueError(f"{key} {act!r}: SpecLens implements SiLU- and GELU(tanh)-gated MLPs only "
                             f"({', '.join(HF_ACTIVATIONS)})")
    if fam.o_bias == "config" and cfg.get("attention_bias"):
        raise ValueError(f"attention_bias: {fam.title} attention bias includes {FEATURES['o_bias'].phrase}, "
                         "which SpecLens does not implement yet")
    if fam.mlp_bias == "config" and cfg.get("mlp_bias"):
        raise ValueError(f"mlp_bias: {fam.title} needs {FEATURES['mlp_bias'].phrase}, which SpecLens does not "
                         "implement yet")
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if cfg.get(key) is not None:
            raise ValueError(f"{key} = {cfg[key]}: {FEATURES['logit_softcap'].phrase} is not implemented in SpecLens")
    if cfg.get("use_bidirectional_attention"):
        raise ValueError("use_bidirectional_attention: SpecLens runs causal decoders only")
    scalar = cfg.get("query_pre_attn_scalar")
    if scalar is not None and (isinstance(scalar, bool) or not isinstance(scalar, (int, float)) or not scalar > 0):
        raise ValueError(f"query_pre_attn_scalar must be a positive number, got {scalar!r}")
    factor = partial_rotary_factor(cfg)
    if factor != 1.0 and not fam.partial_rotary:  # its transformers code turns whole heads whatever the field says
        raise ValueError(f"partial_rotary_factor = {factor}: {fam.title} applies RoPE to whole heads; SpecLens will "
                         "not guess which one the checkpoint was trained with")
    window_layers(fam, cfg)
    if fam.window == "none" and cfg.get("use_sliding_window") and cfg.get("sliding_window"):
        raise ValueError(f"use_sliding_window: SpecLens does not run {fam.title} with a sliding window")
    nope_layers(fam, cfg)
    rope_parameters(fam, cfg)
    return fam


def hf_defaults(fam: Family) -> dict[str, Any]:
    return dict(fam.hf_defaults)


def partial_rotary_factor(cfg: Mapping[str, Any]) -> float:
    """The share of each head RoPE turns (Phi-4-mini: 0.75), from config.json or its rope_parameters."""
    rp = cfg.get("rope_parameters")
    f = cfg.get("partial_rotary_factor")
    if f is None and isinstance(rp, Mapping):
        f = rp.get("partial_rotary_factor")
    f = 1.0 if f is None else f
    if isinstance(f, bool) or not isinstance(f, (int, float)) or not 0.0 < f <= 1.0:
        raise ValueError(f"partial_rotary_factor must be in (0, 1], got {f!r}")
    return float(f)


def window_layers(fam: Family, cfg: Mapping[str, Any]) -> tuple[bool, ...]:
    """Which layers attend through the sliding window, one flag per layer (all False: none).

    Mistral and Phi-3 window every layer when sliding_window is set; Qwen only with use_sliding_window, and then the
    layers layer_types marks (or, without it, those from max_window_layers on); Gemma 3 the layers layer_types marks
    (or, without it, all but every sliding_window_pattern-th)."""
    n = cfg.get("num_hidden_layers", 0)
    n = n if isinstance(n, int) and n > 0 else 0
    w = cfg.get("sliding_window", dict(fam.hf_defaults).get("sliding_window"))
    if fam.window == "pattern" and w is None:  # its layer types would still pick each layer's RoPE base
        raise ValueError(f"{fam.title} without a sliding_window is not a configuration SpecLens runs")
    if fam.window == "none" or w is None or (fam.window == "layers" and not cfg.get("use_sliding_window")):
        return (False,) * n
    if isinstance(w, bool) or not isinstance(w, int) or w < 1:
        raise ValueError(f"sliding_window must be a positive integer, got {w!r}")
    if fam.window == "all":
        return (True,) * n
    types = cfg.get("layer_types")
    if types is not None:
        if not isinstance(types, list) or len(types) != n:
            raise ValueError(f"layer_types must list one type per layer ({n}), got {types!r}")
        odd = [t for t in types if t not in ("full_attention", "sliding_attention")]
        if odd:
            raise ValueError(f"layer_types {odd[0]!r}: SpecLens runs full_attention and sliding_attention layers only")
        return tuple(t == "sliding_attention" for t in types)
    if fam.window == "layers":
        first = cfg.get("max_window_layers", 0) or 0
        return tuple(i >= first for i in range(n))
    pattern = cfg.get("sliding_window_pattern", dict(fam.hf_defaults).get("sliding_window_pattern", 1))
    if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
        raise ValueError(f"sliding_window_pattern must be a positive integer, got {pattern!r}")
    return tuple(bool((i + 1) % pattern) for i in range(n))


def nope_layers(fam: Family, cfg: Mapping[str, Any]) -> tuple[bool, ...]:
    """Which layers attend without RoPE, one flag per layer (all False: none). SmolLM3's config.json lists
    no_rope_layers as 1 where a layer uses RoPE and 0 where it does not, or states an interval (every 4th)."""
    n = cfg.get("num_hidden_layers", 0)
    n = n if isinstance(n, int) and n > 0 else 0
    if "nope_layers" not in fam.extra:
        return (False,) * n
    listed = cfg.get("no_rope_layers")
    if listed is None:
        every = cfg.get("no_rope_layer_interval", 4)
        if isinstance(every, bool) or not isinstance(every, int) or every < 1:
            raise ValueError(f"no_rope_layer_interval must be a positive integer, got {every!r}")
        return tuple((i + 1) % every == 0 for i in range(n))
    if not isinstance(listed, list) or len(listed) != n or any(v not in (0, 1) for v in listed):
        raise ValueError(f"no_rope_layers must list a 0 or 1 per layer ({n}), got {str(listed)[:60]}")
    return tuple(not v for v in listed)


def rope_parameters(fam: Family, cfg: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The RoPE of the global layers and of the windowed ones (None where the family has one RoPE for all), each a
    dict with rope_theta and, when scaled, rope_type and its parameters; from either config.json form (rope_theta
    and rope_scaling, or transformers 5's rope_parameters, flat or per layer type)."""
    defaults = dict(fam.hf_defaults)
    rp = cfg.get("rope_parameters")
    rp = rp if isinstance(rp, Mapping) else {}
    per_type = "full_attention" in rp or "sliding_attention" in rp
    glob = {"rope_theta": cfg.get("rope_theta") or defaults.get("rope_theta", 10000.0)}
    glob |= dict(cfg.get("rope_scaling") or {})
    glob |= dict((rp.get("full_attention") or {}) if per_type else rp)
    local = None
    if "local_rope" in fam.extra:
        local = {"rope_theta": cfg.get("rope_local_base_freq") or defaults.get("rope_local_base_freq", 10000.0)}
        local |= dict(rp.get("sliding_attention") or {})
        kind = local.get("rope_type", local.get("type"))
        if kind not in (None, "default"):
            raise ValueError(f"rope_type {kind!r} on the sliding-window layers: SpecLens scales the RoPE of the "
                             "global layers only")
    elif per_type and rp.get("sliding_attention") and rp.get("sliding_attention") != rp.get("full_attention"):
        raise ValueError(f"{fam.title} with a separate RoPE for its sliding-window layers is not implemented")
    for d in (glob, local):
        if d is not None and not (isinstance(d["rope_theta"], (int, float)) and d["rope_theta"] > 0):
            raise ValueError(f"rope_theta must be a positive number, got {d['rope_theta']!r}")
    return glob, local


def phrases(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]
