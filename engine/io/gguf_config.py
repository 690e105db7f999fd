"""A GGUF file's metadata as a ModelConfig, every value checked before anything is sized by it.

The keys are llama.cpp's (`{arch}.embedding_length`, `{arch}.attention.head_count`, ...); which features a file's
family carries is its row in engine.model.families. engine.io.gguf_file parses the file and reads its tensors.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from engine.api.config import ModelConfig
from engine.api.errors import ModelLoadError
from engine.model.families import BY_GGUF_ARCH, Family
from engine.model.gguf_refusal import gguf_refusal

# Gemma 3 windows every layer but each n-th when the file states no pattern (llama.cpp's default, and HF's)
_GEMMA3_PATTERN = 6
# The end-of-turn tokens llama.cpp stops at, found by their text (llama-vocab.cpp), per architecture
_END_OF_TURN = {"qwen2": ("<|im_end|>", "<|endoftext|>"), "qwen3": ("<|im_end|>", "<|endoftext|>"),
                "gemma3": ("<end_of_turn>",), "phi3": ("<|end|>", "<|endoftext|>")}
# The widest embedding, MLP or head a model may claim: 16x the largest in use today, and small enough that a
# product of two stays far from 64-bit overflow
MAX_WIDTH = 1 << 20


def short_repr(v: Any) -> str:
    """A metadata value for a message: repr, cut short (a hostile value may be a megabyte long)."""
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def arch_meta(path: Path, arch: str, metadata: Mapping[str, Any], key: str, default: Any = ...) -> Any:
    """`{arch}.{key}` from the metadata (`default` when absent; none given: absent is a ModelLoadError)."""
    full = f"{arch}.{key}"
    if full in metadata:
        return metadata[full]
    if default is ...:
        raise ModelLoadError(f"{path}: GGUF metadata lacks {full!r}")
    return default


class ConfigReader:
    """GGUFFile.config's work: the file's metadata, typed and range-checked key by key, and its tensors' shapes
    (tensors: name -> an object with a `shape`; read_raw: a tensor's values as stored, for the rope factors)."""

    def __init__(self, path: Path, arch: str, metadata: Mapping[str, Any], tensors: Mapping[str, Any],
                 read_raw: Callable[[str], np.ndarray]) -> None:
        self.path, self.arch, self.metadata, self.tensors, self.read_raw = path, arch, metadata, tensors, read_raw

    def _meta(self, key: str, default: Any = ...) -> Any:
        return arch_meta(self.path, self.arch, self.metadata, key, default)

    def _int(self, key: str, lo: int, hi: int, default: Any = ...) -> int:
        """An integer metadata value, checked before anything is sized by it: a string, a float, a bool or a value
        out of [lo, hi] names the key and the file."""
        v = self._meta(key, default)
        if isinstance(v, list):
            raise ModelLoadError(f"{self.path}: GGUF metadata {self.arch}.{key} is a list; per-layer values "
                                 "are not supported")
        if isinstance(v, bool) or not isinstance(v, int):
            raise ModelLoadError(f"{self.path}: GGUF metadata {self.arch}.{key} must be an integer, "
                                 f"got {short_repr(v)}")
        if not lo <= v <= hi:
            raise ModelLoadError(f"{self.path}: GGUF metadata {self.arch}.{key} is {v}, outside [{lo}, {hi}]; "
                                 "the file is damaged or not a model SpecLens runs")
        return v

    def _float(self, key: str, default: float, lo: float, hi: float) -> float:
        v = self._meta(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo < v < hi:
            raise ModelLoadError(f"{self.path}: GGUF metadata {self.arch}.{key} must be a finite number in "
                                 f"({lo:g}, {hi:g}), got {short_repr(v)}")
        return float(v)

    def _token_id(self, key: str, vocab: int) -> int | None:
        full = f"tokenizer.ggml.{key}_token_id"
        v = self.metadata.get(full)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < vocab:
            raise ModelLoadError(f"{self.path}: GGUF metadata {full} must be a token id in [0, {vocab}), "
                                 f"got {short_repr(v)}")
        return v

    def config(self) -> ModelConfig:
        """The model's config, every value it is built from checked first (type, range, agreement with the
        tensors' shapes): a hostile or damaged header is a ModelLoadError naming the key, never an allocation
        sized by it. The family's row (engine.model.families) says which features the file's tensors carry."""
        if (why := gguf_refusal(self.arch, self.metadata, self.tensors)) is not None:  # engine.model.gguf_refusal
            raise ModelLoadError(f"{self.path}: {why}")
        fam = BY_GGUF_ARCH[self.arch]
        embd = self.tensors.get("token_embd.weight")
        if embd is None:
            raise ModelLoadError(f"{self.path}: GGUF has no token_embd.weight tensor")
        if len(embd.shape) != 2 or embd.shape[0] < 1:
            raise ModelLoadError(f"{self.path}: tensor 'token_embd.weight' has shape {embd.shape}, expected "
                                 "(vocabulary, embedding_length)")
        vocab = embd.shape[0]
        hidden = self._int("embedding_length", 1, MAX_WIDTH)
        if hidden != embd.shape[1]:
            raise ModelLoadError(f"{self.path}: GGUF metadata {self.arch}.embedding_length is {hidden} but "
                                 f"token_embd.weight has rows of {embd.shape[1]}")
        heads, kv, head_dim, rotary = self._attention_shape(hidden)
        # every layer has at least one tensor, so a count beyond the file's tensors is a lie (and would size lists)
        layers = self._int("block_count", 1, max(1, len(self.tensors)))
        ffn = self._int("feed_forward_length", 1, MAX_WIDTH)
        context = self._int("context_length", 2, 2**31 - 1, 4096)
        eps = self._float("attention.layer_norm_rms_epsilon", 1e-5, 0.0, 1.0)
        theta = self._float("rope.freq_base", 10000.0, 0.0, 1e12)
        window, windowed = self._windows(fam.window, layers, context)
        local_theta = None
        if "local_rope" in fam.extra and any(windowed):  # llama.cpp's default base for Gemma 3's windowed layers
            local_theta = self._float("rope.freq_base_swa", 10000.0, 0.0, 1e12)
        scaling = self._rope_scaling(rotary, context)
        if scaling is not None and scaling["rope_type"] == "longrope":
            # the engine runs LongRoPE within the short factors' range (ModelConfig._check_longrope)
            context = min(context, scaling["original_max_position_embeddings"])
        tokens = self.metadata.get("tokenizer.ggml.tokens") or []
        embedding_scale, attn_scale, residual_scale, logit_scale = self._multipliers(fam, hidden, heads, layers)
        # NoPE layers: llama.cpp's own pattern for the arch (the file states none), every nope_step-th layer
        nope = tuple(fam.nope_step > 0 and (i + 1) % fam.nope_step == 0 for i in range(layers))
        try:
            cfg = ModelConfig(
                vocab_size=vocab,
                hidden_size=hidden,
                intermediate_size=ffn,
                num_layers=layers,
                num_heads=heads,
                num_kv_heads=kv,
                head_dim=head_dim,
                rms_norm_eps=float(f"{eps:.7g}"),  # stored as f32
                rope_theta=theta,
                rope_scaling=scaling,
                max_position_embeddings=context,
                tie_word_embeddings="output.weight" not in self.tensors,
                attention_bias="blk.0.attn_q.bias" in self.tensors or "blk.0.attn_qkv.bias" in self.tensors,
                bos_token_id=self._token_id("bos", vocab),
                eos_token_ids=self._eos_ids(tokens, vocab),
                arch=self.arch,
                norm_offset=0.0,  # llama.cpp's converter already added Gemma's 1 to its norm weights
                qk_norm=fam.qk_norm,
                activation="silu" if fam.activation == "silu" else "gelu_tanh",
                embedding_scale=embedding_scale,
                sandwich_norm="sandwich_norm" in fam.extra,
                sliding_window=window,
                window_layers=windowed if window is not None else (),
                rope_local_theta=local_theta,
                rotary_dim=rotary,
                attn_scale=attn_scale,
                nope_layers=nope,
                residual_scale=residual_scale,
                logit_scale=logit_scale,
            )
        except ValueError as e:
            raise ModelLoadError(f"{self.path}: invalid model metadata: {e}") from e
        self._check_shapes(cfg)
        return cfg

    def _attention_shape(self, hidden: int) -> tuple[int, int, int, int]:
        """(heads, KV heads, head size, rotary size), each checked against the others: whole KV groups, an even
        head and rotary size, keys and values of one size."""
        heads = self._int("attention.head_count", 1, MAX_WIDTH)
        kv = self._int("attention.head_count_kv", 1, heads, heads)
        if heads % kv:
            raise ModelLoadError(f"{self.path}: GGUF metadata {self.arch}.attention.head_count ({heads}) is not a "
                                 f"multiple of attention.head_count_kv ({kv})")
        head_dim = self._int("attention.key_length", 0, MAX_WIDTH, 0) or hidden // heads
        if head_dim < 2 or head_dim % 2:  # rotary embeddings turn pairs of values
            raise ModelLoadError(f"{self.path}: GGUF metadata gives heads of {head_dim} values "
                                 f"({self.arch}.attention.head_count {heads}); rotary embeddings need an even size")
        value_dim = self._int("attention.value_length", 0, MAX_WIDTH, 0) or head_dim
        if value_dim != head_dim:
            raise ModelLoadError(f"{self.path}: GGUF metadata {self.arch}.attention.value_length ({value_dim}) "
                                 f"differs from key_length ({head_dim}); SpecLens needs keys and values of one size")
        rotary = self._int("rope.dimension_count", 0, head_dim, 0) or head_dim
        if rotary < 2 or rotary % 2:
            raise ModelLoadError(f"{self.path}: GGUF metadata {self.arch}.rope.dimension_count is {rotary}; "
                                 "rotary embeddings turn pairs of values, so it must be even")
        if BY_GGUF_ARCH[self.arch].gguf_qk_interleaved and rotary != head_dim:  # q/k permuted over whole heads
            raise ModelLoadError(f"{self.path}: GGUF metadata {self.arch}.rope.dimension_count is {rotary} for heads "
                                 f"of {head_dim}; llama.cpp's {self.arch} architecture turns whole heads (it refuses "
                                 "this too)")
        return heads, kv, head_dim, rotary

    def _windows(self, kind: str, layers: int, context: int) -> tuple[int | None, tuple[bool, ...]]:
        """The attention window and which layers use it, as llama.cpp reads them: Gemma 3 windows all layers but
        every sliding_window_pattern-th (6 unless stated), a per-layer array states them outright, other families
        (Mistral's, written as llama) window every layer. (None, ()) when the window cannot matter: absent, 0, or
        no shorter than the context."""
        window = self._int("attention.sliding_window", 0, 2**31 - 1, 0)
        if window == 0:
            return None, ()
        pattern = self._meta("attention.sliding_window_pattern", None)
        if isinstance(pattern, list):
            if len(pattern) != layers or any(not isinstance(v, (bool, int)) for v in pattern):
                raise ModelLoadError(f"{self.path}: GGUF metadata {self.arch}.attention.sliding_window_pattern "
                                     f"must hold one flag per layer ({layers}), got {short_repr(pattern)}")
            windowed = tuple(bool(v) for v in pattern)
        elif kind == "pattern":
            n = self._int("attention.sliding_window_pattern", 0, layers + 1, _GEMMA3_PATTERN)
            windowed = tuple(n == 0 or i % n < n - 1 for i in range(layers))
        else:
            windowed = (True,) * layers
        if window >= context or not any(windowed):
            return None, ()
        return window, windowed

    def _multipliers(self, fam: Family, hidden: int, heads: int, layers: int) -> tuple[float, float, float, float]:
        """(embedding, attention, residual, logit) scales as llama.cpp applies them: Granite states all four
        (attention.scale absent or 0: 1/sqrt(head_dim), returned as 0); Gemma scales embeddings by sqrtf(n_embd) in
        f32 whatever the weights' type, and Gemma 3 27B (62 layers) queries by 1/sqrt(embedding_length /
        head_count); every other family by none of them."""
        if "multipliers" in fam.extra:
            stated = self._meta("attention.scale", None)  # absent or 0: llama.cpp's 1/sqrt(head_dim)
            attn = 0.0 if stated is None or stated == 0 else self._float("attention.scale", 0.0, 0.0, 1e6)
            return (self._float("embedding_scale", 1.0, 0.0, 1e6), attn, self._float("residual_scale", 1.0, 0.0, 1e6),
                    self._float("logit_scale", 1.0, 0.0, 1e6))
        embedding = float(np.sqrt(np.float32(hidden))) if fam.embedding_scale else 1.0
        attn = 0.0
        if fam.gguf_arch == "gemma3" and layers == 62:
            attn = float(np.float32(1.0) / np.sqrt(np.float32(hidden // heads)))
        return embedding, attn, 1.0, 1.0

    def _check_shapes(self, c: ModelConfig) -> None:
        """Every tensor the config implies is in the file with the shape it implies: a missing one or a
        metadata value that disagrees with the weights (feed_forward_length, say) fails here, at load, naming
        both, rather than as a KeyError or at the first generation."""
        q, kv, d = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.head_dim
        h, f = c.hidden_size, c.intermediate_size
        want: dict[str, tuple[int, ...]] = {"token_embd.weight": (c.vocab_size, h), "output_norm.weight": (h,)}
        if not c.tie_word_embeddings:
            want["output.weight"] = (c.vocab_size, h)
        layer: dict[str, tuple[int, ...]] = {"attn_norm.weight": (h,), "ffn_norm.weight": (h,)}
        if "blk.0.attn_qkv.weight" in self.tensors:  # fused q | k | v (Phi-3)
            layer["attn_qkv.weight"] = (q + 2 * kv, h)
        else:
            layer |= {"attn_q.weight": (q, h), "attn_k.weight": (kv, h), "attn_v.weight": (kv, h)}
        layer["attn_output.weight"] = (h, q)
        if self._fused_gate_up():
            layer["ffn_up.weight"] = (2 * f, h)
        else:
            layer |= {"ffn_gate.weight": (f, h), "ffn_up.weight": (f, h)}
        layer["ffn_down.weight"] = (h, f)
        if c.attention_bias:
            fused = "blk.0.attn_qkv.weight" in self.tensors
            layer |= {"attn_qkv.bias": (q + 2 * kv,)} if fused else {"attn_q.bias": (q,), "attn_k.bias": (kv,),
                                                                     "attn_v.bias": (kv,)}
        if c.qk_norm:
            layer |= {"attn_q_norm.weight": (d,), "attn_k_norm.weight": (d,)}
        if c.sandwich_norm:
            layer |= {"post_attention_norm.weight": (h,), "post_ffw_norm.weight": (h,)}
        for i in range(c.num_layers):
            want |= {f"blk.{i}.{k}": v for k, v in layer.items()}
        missing = [n for n in want if n not in self.tensors]
        if missing:
            more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
            raise ModelLoadError(f"{self.path}: GGUF lacks tensor {', '.join(missing[:3])}{more} that its metadata "
                                 f"({self.arch}.block_count {c.num_layers}) implies")
        keys = {"ffn_gate": "feed_forward_length", "ffn_up": "feed_forward_length", "ffn_down": "feed_forward_length",
                "attn_q": "attention.head_count", "attn_k": "attention.head_count_kv",
                "attn_v": "attention.head_count_kv", "attn_output": "attention.head_count",
                "attn_qkv": "attention.head_count", "attn_q_norm": "attention.key_length",
                "attn_k_norm": "attention.key_length"}
        for name, shape in want.items():
            t = self.tensors[name]
            if t.shape != shape:
                kind = name.split(".")[-2]
                key = keys.get(kind, "embedding_length")
                raise ModelLoadError(f"{self.path}: tensor {name!r} has shape {t.shape} but the GGUF metadata "
                                     f"({self.arch}.{key} and the others) implies {shape}")

    def _fused_gate_up(self) -> bool:
        """Whether ffn_up holds gate | up rows (Phi-3, which has no ffn_gate)."""
        return self.arch == "phi3" and "blk.0.ffn_gate.weight" not in self.tensors

    def _eos_ids(self, tokens: list[str], vocab: int) -> tuple[int, ...]:
        ids = [self._token_id(k, vocab) for k in ("eos", "eot", "eom")]
        ends = _END_OF_TURN.get(self.arch, ())
        if ends and isinstance(tokens, Sequence) and not isinstance(tokens, (str, bytes)):
            # chat models end turns with these (Qwen's <|im_end|>, Gemma's <end_of_turn>): llama.cpp stops there too;
            # the parser's StringArray finds a string without decoding the vocabulary
            find = getattr(tokens, "find", None) or (lambda t: tokens.index(t) if t in tokens else None)
            ids += sorted(i for i in map(find, ends) if i is not None and i < vocab)
        return tuple(dict.fromkeys(i for i in ids if i is not None))

    def _rope_scaling(self, rotary: int, context: int) -> dict[str, Any] | None:
        """The global layers' rope_scaling: llama3's from rope_freqs, linear from rope.scaling.factor, LongRoPE
        from Phi-3's rope_factors_short/long tensors; None for plain RoPE. Any other kind is refused."""
        kind = self._meta("rope.scaling.type", "none")
        if "rope_factors_short.weight" in self.tensors or "rope_factors_long.weight" in self.tensors:
            if kind not in ("none", "longrope", None):
                raise ModelLoadError(f"{self.path}: GGUF holds LongRoPE factors but states rope scaling "
                                     f"{short_repr(kind)}")
            return self._longrope(rotary, context)
        if kind == "linear":
            factor = self._float("rope.scaling.factor", 1.0, 0.0, 1e6) if self._meta("rope.scaling.factor", 0) else 1.0
            return None if factor == 1.0 else {"rope_type": "linear", "factor": factor}
        if kind not in ("none", None):
            raise ModelLoadError(f"{self.path}: unsupported rope scaling {short_repr(kind)}")
        t = self.tensors.get("rope_freqs.weight")
        if t is None:
            return None
        if t.shape != (rotary // 2,):
            raise ModelLoadError(f"{self.path}: tensor 'rope_freqs.weight' has shape {t.shape}, expected "
                                 f"({rotary // 2},) for heads of {rotary} values")
        return _llama3_scaling(self.read_raw("rope_freqs.weight"), self.path, self._meta("rope.freq_base", 10000.0))

    def _longrope(self, rotary: int, context: int) -> dict[str, Any]:
        """Phi-3's LongRoPE as transformers states it: the engine runs within original_context_length, where the
        short factors apply; the attention factor is the file's (its converter computes it as transformers does)."""
        for name in ("rope_factors_short.weight", "rope_factors_long.weight"):
            t = self.tensors.get(name)
            if t is None or t.shape != (rotary // 2,):
                raise ModelLoadError(f"{self.path}: LongRoPE needs tensor {name!r} of shape ({rotary // 2},), "
                                     f"one factor per rotary frequency; got {t.shape if t else 'none'}")
        short, long = self.read_raw("rope_factors_short.weight"), self.read_raw("rope_factors_long.weight")
        if not (np.isfinite(short).all() and np.isfinite(long).all() and (short > 0).all() and (long > 0).all()):
            raise ModelLoadError(f"{self.path}: LongRoPE factors must be finite and positive")
        orig = self._int("rope.scaling.original_context_length", 2, context, context)
        attention = self._float("rope.scaling.attn_factor", 1.0, 0.0, 100.0)
        return {"rope_type": "longrope", "short_factor": short.tolist(), "long_factor": long.tolist(),
                "original_max_position_embeddings": orig, "attention_factor": attention,
                "max_position_embeddings": context}


def _llama3_scaling(freqs: np.ndarray, path: Path, theta: float) -> dict[str, Any]:
    """Recover Llama 3.1-style rope_scaling from llama.cpp's rope_freqs tensor (which stores only the
    per-frequency factors): the factor is their maximum; the other parameters are Meta's, checked to fit."""
    factor = float(freqs.max())
    params = {"rope_type": "llama3", "factor": factor, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
              "original_max_position_embeddings": 8192}
    dim = 2 * freqs.size
    inv = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    wavelen = 2 * math.pi / inv
    lo, hi = params["original_max_position_embeddings"] / np.array([1.0, 4.0])
    smooth = (params["original_max_position_embeddings"] / wavelen - 1.0) / (4.0 - 1.0)
    expect = np.where(wavelen < hi, 1.0, np.where(wavelen > lo, factor, 1.0 / ((1 - smooth) / factor + smooth)))
    if not np.allclose(expect, freqs, rtol=1e-3):
        raise ModelLoadError(f"{path}: rope_freqs does not match Llama 3 rope scaling; unsupported rope variant")
    return params
