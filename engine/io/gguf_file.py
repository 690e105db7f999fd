"""Read a .gguf file: a ModelConfig from its metadata, its tensors dequantized and renamed to Hugging Face names.

The header is parsed here rather than with `gguf.GGUFReader`: the reader builds one numpy view per string,
which takes ~9 s for a Qwen vocabulary (300k strings); this parse takes a fraction of a second, so listing
and loading GGUF models stays quick. Dequantization is `gguf.quants.dequantize`.
"""
from __future__ import annotations

import bisect
import functools
import math
import mmap
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, LlamaFileType
from gguf.quants import dequantize

from engine.api.config import ModelConfig
from engine.api.errors import ModelLoadError
from engine.model.families import BY_GGUF_ARCH, Family
from engine.model.gguf_refusal import gguf_refusal

_MAGIC = b"GGUF"
_SCALARS = {  # value type -> struct format (little-endian)
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H", GGUFValueType.INT16: "<h",
    GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i", GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?",
    GGUFValueType.UINT64: "<Q", GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}
_MAX_NESTING = 4  # arrays of arrays in metadata; llama.cpp writes none nested
_MAX_DIMS = 4  # GGML_MAX_DIMS

# GGUF tensor name (after "blk.{i}.") -> Hugging Face name (after "model.layers.{i}.")
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_qkv.weight": "self_attn.qkv_proj.weight",  # Phi-3's fused q | k | v
    "attn_qkv.bias": "self_attn.qkv_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
# Where a family's names differ: Gemma 3's post_attention_layernorm is the norm after attention (its pre-MLP norm
# is pre_feedforward_layernorm); Phi-3's ffn_up holds gate | up rows, as its gate_up_proj does.
_ARCH_LAYER_NAMES = {
    "gemma3": {"ffn_norm.weight": "pre_feedforward_layernorm.weight",
               "post_attention_norm.weight": "post_attention_layernorm.weight",
               "post_ffw_norm.weight": "post_feedforward_layernorm.weight"},
    "phi3": {"ffn_up.weight": "mlp.gate_up_proj.weight"},
}
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}
# folded into ModelConfig.rope_scaling: llama3's factors, Phi-3's LongRoPE factors
_IGNORED = {"rope_freqs.weight", "rope_factors_short.weight", "rope_factors_long.weight"}
# Gemma 3 windows every layer but each n-th when the file states no pattern (llama.cpp's default, and HF's)
_GEMMA3_PATTERN = 6
# The end-of-turn tokens llama.cpp stops at, found by their text (llama-vocab.cpp), per architecture
_END_OF_TURN = {"qwen2": ("<|im_end|>", "<|endoftext|>"), "qwen3": ("<|im_end|>", "<|endoftext|>"),
                "gemma3": ("<end_of_turn>",), "phi3": ("<|end|>", "<|endoftext|>")}


@dataclass(frozen=True)
class TensorInfo:
    name: str  # GGUF name, e.g. "blk.0.attn_q.weight"
    qtype: GGMLQuantizationType
    shape: tuple[int, ...]  # numpy / HF order: GGUF's ne order reversed
    offset: int  # absolute byte offset in the file
    nbytes: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


MADV_POPULATE_READ = 22  # Linux's value; Python's mmap module does not name it


class StringArray(Sequence[str]):
    """A GGUF string array, decoded on first use. A vocabulary and its merges are 300k strings (~0.4 s to
    decode); a draft's are only compared with its target's, which raw bytes do, and searched for a few
    end-of-turn markers."""

    def __init__(self, raw: bytes, starts: list[int]) -> None:
        self.raw, self.starts = raw, starts  # length-prefixed entries, and where each begins in raw

    @functools.cached_property
    def items(self) -> list[str]:
        raw, ends = self.raw, [*self.starts[1:], len(self.raw)]
        return [raw[a + 8:b].decode("utf-8", errors="replace") for a, b in zip(self.starts, ends)]

    def __len__(self) -> int:
        return len(self.starts)

    def __getitem__(self, i):  # type: ignore[override]
        return self.items[i]

    def __iter__(self) -> Iterator[str]:
        return iter(self.items)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, StringArray):
            return self.raw == other.raw and len(self) == len(other)
        return isinstance(other, (list, tuple)) and list(self.items) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def find(self, text: str) -> int | None:
        """Index of the first entry equal to text, without decoding the others."""
        data = text.encode()
        needle, at = struct.pack("<Q", len(data)) + data, 0
        while (at := self.raw.find(needle, at)) >= 0:
            i = bisect.bisect_left(self.starts, at)
            if i < len(self.starts) and self.starts[i] == at:
                return i
            at += 1
        return None


class _Cursor:
    """Little-endian reads over a buffer; running off its end means the file is truncated."""

    def __init__(self, buf: Any, path: Path) -> None:
        self.buf, self.pos, self.path = buf, 0, path

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise ModelLoadError(f"{self.path}: GGUF header is truncated (needed byte {self.pos + size}, file has {len(self.buf)})")
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return v

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise ModelLoadError(f"{self.path}: GGUF header is truncated inside a string at byte {self.pos}")
        raw = self.buf[self.pos:self.pos + n]
        self.pos += n
        return bytes(raw).decode("utf-8", errors="replace")

    def strings(self, count: int) -> StringArray:
        """An array of strings, located now and decoded on first use (see StringArray). Locating is a walk over
        the length prefixes (~600k in a vocabulary and its merges, per file), so the loop does nothing else:
        a prefix past the end raises struct.error, and the end is checked once."""
        if count * 8 > len(self.buf) - self.pos:  # each entry has an 8-byte length: a larger count is a lie
            raise ModelLoadError(f"{self.path}: GGUF header is truncated inside a string array of {count} entries "
                                 f"at byte {self.pos}")
        buf, base, starts = self.buf, self.pos, [0] * count
        length, pos = struct.Struct("<Q").unpack_from, base
        try:
            for i in range(count):
                starts[i] = pos - base
                pos += 8 + length(buf, pos)[0]
        except struct.error:
            pos = len(self.buf) + 1
        if pos > len(self.buf):
            raise ModelLoadError(f"{self.path}: GGUF header is truncated inside a string array that starts at byte {base}")
        arr = StringArray(bytes(buf[base:pos]), starts)
        self.pos = pos
        return arr

    def value(self, vtype: int, depth: int = 0) -> Any:
        if vtype == GGUFValueType.STRING:
            return self.string()
        if vtype == GGUFValueType.ARRAY:
            if depth >= _MAX_NESTING:  # each level costs only 12 bytes, so a file could nest past Python's stack
                raise ModelLoadError(f"{self.path}: GGUF metadata nests arrays deeper than {_MAX_NESTING} levels "
                                     f"at byte {self.pos}; the file is damaged")
            sub, count = self.take("<I"), self.take("<Q")
            if sub in _SCALARS:  # numeric arrays in one numpy read: token_type has ~150k entries
                dt = np.dtype(_SCALARS[GGUFValueType(sub)].replace("?", "b1"))
                end = self.pos + count * dt.itemsize
                if end > len(self.buf):
                    raise ModelLoadError(f"{self.path}: GGUF header is truncated inside an array at byte {self.pos}")
                arr = np.frombuffer(self.buf, dtype=dt, count=count, offset=self.pos).tolist()
                self.pos = end
                return arr
            if sub == GGUFValueType.STRING:
                return self.strings(count)
            if count * 4 > len(self.buf) - self.pos:  # every element takes at least 4 bytes
                raise ModelLoadError(f"{self.path}: GGUF header is truncated inside an array at byte {self.pos}")
            return [self.value(sub, depth + 1) for _ in range(count)]
        if vtype not in _SCALARS:
            raise ModelLoadError(f"{self.path}: unknown GGUF metadata value type {vtype} at byte {self.pos}")
        return self.take(_SCALARS[GGUFValueType(vtype)])


class GGUFFile:
    """One .gguf file, memory-mapped. `check_data=False` accepts a file cut short after the header
    (e.g. the first part of a split download), for reading metadata only."""

    def __init__(self, path: str | Path, *, check_data: bool = True) -> None:
        self.path = Path(path)
        try:
            with open(self.path, "rb") as f:
                if self.path.stat().st_size == 0:
                    raise ModelLoadError(f"{self.path}: file is empty (not a GGUF model)")
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except OSError as e:
            raise ModelLoadError(f"{self.path}: cannot read GGUF file: {e.strerror or e}") from e
        self.metadata: dict[str, Any] = {}
        self.tensors: dict[str, TensorInfo] = {}
        self._parse(check_data)
        arch = self.metadata.get("general.architecture", "")
        if not isinstance(arch, str) or len(arch) > 64:  # it prefixes every key the config reads
            raise ModelLoadError(f"{self.path}: GGUF metadata general.architecture must be a short name, got "
                                 f"{_short(arch)}")
        self.arch: str = arch

    def _parse(self, check_data: bool) -> None:
        c = _Cursor(self._mm, self.path)
        if self._mm[:4] != _MAGIC:
            raise ModelLoadError(f"{self.path}: not a GGUF file (bad magic {bytes(self._mm[:4])!r})")
        c.pos = 4
        version = c.take("<I")
        if version not in (2, 3):
            raise ModelLoadError(f"{self.path}: unsupported GGUF version {version} (supported: 2, 3; "
                                 "big-endian files are not supported)")
        n_tensors, n_kv = c.take("<Q"), c.take("<Q")
        for _ in range(n_kv):
            key = c.string()
            self.metadata[key] = c.value(c.take("<I"))
        infos = []
        for _ in range(n_tensors):
            name = c.string()
            n_dims = c.take("<I")
            if n_dims > _MAX_DIMS:
                raise ModelLoadError(f"{self.path}: tensor {name!r} claims {n_dims} dimensions (GGUF allows at most "
                                     f"{_MAX_DIMS}); the file is damaged")
            dims = [c.take("<Q") for _ in range(n_dims)]
            raw_type, rel = c.take("<I"), c.take("<Q")
            try:
                qtype = GGMLQuantizationType(raw_type)
            except ValueError:
                raise ModelLoadError(f"{self.path}: tensor {name!r} has unknown ggml type {raw_type}") from None
            infos.append((name, qtype, tuple(reversed(dims)), rel))
        align = self.metadata.get("general.alignment", 32)
        if isinstance(align, bool) or not isinstance(align, int) or align < 1 or align & (align - 1):
            # the data offset rounds up to it: 0 divides by zero, others misplace every tensor (llama.cpp agrees)
            raise ModelLoadError(f"{self.path}: invalid general.alignment {align!r} in the GGUF header "
                                 "(it must be a power of two, 32 by default); the file is damaged")
        data_start = -(-c.pos // align) * align
        size = len(self._mm)
        for name, qtype, shape, rel in infos:
            if qtype not in GGML_QUANT_SIZES:
                raise ModelLoadError(f"{self.path}: tensor {name!r} has ggml type {qtype.name}, which SpecLens cannot read")
            block, type_size = GGML_QUANT_SIZES[qtype]
            numel = math.prod(shape)
            if shape and shape[-1] % block:
                raise ModelLoadError(f"{self.path}: tensor {name!r} row length {shape[-1]} is not a multiple of "
                                     f"the {qtype.name} block size {block}")
            t = TensorInfo(name, qtype, shape, data_start + rel, numel // block * type_size)
            if check_data and t.offset + t.nbytes > size:
                raise ModelLoadError(f"{self.path}: file is truncated: tensor {name!r} ends at byte "
                                     f"{t.offset + t.nbytes} but the file has {size} bytes")
            self.tensors[name] = t

    # --- config -------------------------------------------------------------------------------------------

    def _meta(self, key: str, default: Any = ...) -> Any:
        full = f"{self.arch}.{key}"
        if full in self.metadata:
            return self.metadata[full]
        if default is ...:
            raise ModelLoadError(f"{self.path}: GGUF metadata lacks {full!r}")
        return default

    def _int(self, key: str, lo: int, hi: int, default: Any = ...) -> int:
        """An integer metadata value, checked before anything is sized by it: a string, a float, a bool or a value
        out of [lo, hi] names the key and the file."""
        v = self._meta(key, default)
        if isinstance(v, list):
            raise ModelLoadError(f"{self.path}: GGUF metadata {self.arch}.{key} is a list; per-layer values "
                                 "are not supported")
        if isinstance(v, bool) or not isinstance(v, int):
            raise ModelLoadError(f"{self.path}: GGUF metadata {self.arch}.{key} must be an integer, got {_short(v)}")
        if not lo <= v <= hi:
            raise ModelLoadError(f"{self.path}: GGUF metadata {self.arch}.{key} is {v}, outside [{lo}, {hi}]; "
                                 "the file is damaged or not a model SpecLens runs")
        return v

    def _float(self, key: str, default: float, lo: float, hi: float) -> float:
        v = self._meta(key, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or not lo < v < hi:
            raise ModelLoadError(f"{self.path}: GGUF metadata {self.arch}.{key} must be a finite number in "
                                 f"({lo:g}, {hi:g}), got {_short(v)}")
        return float(v)

    def _token_id(self, key: str, vocab: int) -> int | None:
        full = f"tokenizer.ggml.{key}_token_id"
        v = self.metadata.get(full)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < vocab:
            raise ModelLoadError(f"{self.path}: GGUF metadata {full} must be a token id in [0, {vocab}), "
                                 f"got {_short(v)}")
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
        hidden = self._int("embedding_length", 1, _MAX_WIDTH)
        if hidden != embd.shape[1]:
            raise ModelLoadError(f"{self.path}: GGUF metadata {self.arch}.embedding_length is {hidden} but "
                                 f"token_embd.weight has rows of {embd.shape[1]}")
        heads, kv, head_dim, rotary = self._attention_shape(hidden)
        # every layer has at least one tensor, so a count beyond the file's tensors is a lie (and would size lists)
        layers = self._int("block_count", 1, max(1, len(self.tensors)))
        ffn = self._int("feed_forward_length", 1, _MAX_WIDTH)
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
        heads = self._int("attention.head_count", 1, _MAX_WIDTH)
        kv = self._int("attention.head_count_kv", 1, heads, heads)
        if heads % kv:
            raise ModelLoadError(f"{self.path}: GGUF metadata {self.arch}.attention.head_count ({heads}) is not a "
                                 f"multiple of attention.head_count_kv ({kv})")
        head_dim = self._int("attention.key_length", 0, _MAX_WIDTH, 0) or hidden // heads
        if head_dim < 2 or head_dim % 2:  # rotary embeddings turn pairs of values
            raise ModelLoadError(f"{self.path}: GGUF metadata gives heads of {head_dim} values "
                                 f"({self.arch}.attention.head_count {heads}); rotary embeddings need an even size")
        value_dim = self._int("attention.value_length", 0, _MAX_WIDTH, 0) or head_dim
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
                                     f"must hold one flag per layer ({layers}), got {_short(pattern)}")
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
        if ends and isinstance(tokens, (StringArray, list)):
            # chat models end turns with these (Qwen's <|im_end|>, Gemma's <end_of_turn>): llama.cpp stops there too
            find = tokens.find if isinstance(tokens, StringArray) else lambda t: tokens.index(t) if t in tokens else None
            ids += sorted(i for i in map(find, ends) if i is not None and i < vocab)
        return tuple(dict.fromkeys(i for i in ids if i is not None))

    def _rope_scaling(self, rotary: int, context: int) -> dict[str, Any] | None:
        """The global layers' rope_scaling: llama3's from rope_freqs, linear from rope.scaling.factor, LongRoPE
        from Phi-3's rope_factors_short/long tensors; None for plain RoPE. Any other kind is refused."""
        kind = self._meta("rope.scaling.type", "none")
        if "rope_factors_short.weight" in self.tensors or "rope_factors_long.weight" in self.tensors:
            if kind not in ("none", "longrope", None):
                raise ModelLoadError(f"{self.path}: GGUF holds LongRoPE factors but states rope scaling "
                                     f"{_short(kind)}")
            return self._longrope(rotary, context)
        if kind == "linear":
            factor = self._float("rope.scaling.factor", 1.0, 0.0, 1e6) if self._meta("rope.scaling.factor", 0) else 1.0
            return None if factor == 1.0 else {"rope_type": "linear", "factor": factor}
        if kind not in ("none", None):
            raise ModelLoadError(f"{self.path}: unsupported rope scaling {_short(kind)}")
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

    # --- tensors ------------------------------------------------------------------------------------------

    def read_raw(self, name: str) -> np.ndarray:
        """A tensor as float32 in numpy (HF) shape, exactly as stored (no un-permuting)."""
        t = self.tensors[name]
        if t.offset + t.nbytes > len(self._mm):
            raise ModelLoadError(f"{self.path}: file is truncated inside tensor {name!r}")
        block, type_size = GGML_QUANT_SIZES[t.qtype]
        shape = t.shape or (1,)
        raw = np.frombuffer(self._mm, dtype=np.uint8, count=t.nbytes, offset=t.offset)
        try:
            out = dequantize(raw.reshape(*shape[:-1], shape[-1] // block * type_size), t.qtype)
        except NotImplementedError:
            raise ModelLoadError(f"{self.path}: tensor {name!r} uses {t.qtype.name}, which gguf cannot dequantize") from None
        out = np.asarray(out, dtype=np.float32).reshape(t.shape)
        return out if out.flags.writeable else out.copy()  # F32 data is a view of the read-only map

    def hf_name(self, name: str) -> str | None:
        """The Hugging Face name of a GGUF tensor; None for tensors folded into the config."""
        if name in _TOP_NAMES:
            return _TOP_NAMES[name]
        if name in _IGNORED:
            return None
        parts = name.split(".", 2)
        names = _LAYER_NAMES | _ARCH_LAYER_NAMES.get(self.arch, {})
        if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in names:
            return f"model.layers.{parts[1]}.{names[parts[2]]}"
        raise ModelLoadError(f"{self.path}: unexpected tensor {name!r} for a {self.arch} model")

    def read(self, name: str) -> np.ndarray:
        """A tensor by GGUF name, float32, in Hugging Face layout."""
        arr = self.read_raw(name)
        heads = self._permuted_heads(name)
        return _unpermute(arr, heads) if heads else arr

    def release(self, name: str) -> None:
        """Drop a tensor's pages from this process's memory map once its blocks were copied (repacked): they
        stay in the page cache, and a later read faults them back in. Without this the whole file counts
        towards the process's RSS while a model loads."""
        if hasattr(mmap, "MADV_DONTNEED"):
            self._advise(name, mmap.MADV_DONTNEED)

    def prefault(self, name: str) -> None:
        """Map a tensor's pages in one call before reading all of it (repacking), rather than faulting them in
        4 KB at a time (~20% of a repack's time). A no-op before Linux 5.14 and on other systems."""
        try:
            self._advise(name, MADV_POPULATE_READ)
        except (OSError, ValueError):
            pass

    def _advise(self, name: str, advice: int) -> None:
        t = self.tensors[name]
        start = t.offset // mmap.PAGESIZE * mmap.PAGESIZE
        end = min(len(self._mm), t.offset + t.nbytes)
        if end > start:
            self._mm.madvise(advice, start, end - start)

    def blocks(self, name: str) -> np.ndarray:
        """A 2-D tensor's quantized blocks as stored, (rows, bytes per row) uint8, rows in Hugging Face order.
        A read-only view of the file's memory map, except for llama's q/k, whose rows are reordered (a copy):
        the permutation moves whole rows, so every quantization block stays intact."""
        t = self.tensors[name]
        if len(t.shape) != 2:
            raise ModelLoadError(f"{self.path}: tensor {name!r} has shape {t.shape}, expected a matrix")
        if t.offset + t.nbytes > len(self._mm):
            raise ModelLoadError(f"{self.path}: file is truncated inside tensor {name!r}")
        rows = t.shape[0]
        raw = np.frombuffer(self._mm, dtype=np.uint8, count=t.nbytes, offset=t.offset).reshape(rows, t.nbytes // rows)
        heads = self._permuted_heads(name)
        if heads:
            order = _unpermute(np.arange(rows)[:, None], heads)[:, 0]
            raw = raw[order]
        return raw

    def _permuted_heads(self, name: str) -> int:
        """llama.cpp's converter interleaves the two rotary halves of each head of q and k in the families whose row
        says so (llama and its heirs): over how many heads (0: not permuted)."""
        kind = name.split(".")[-2] if name.count(".") >= 2 else ""
        fam = BY_GGUF_ARCH.get(self.arch)
        if fam is None or not fam.gguf_qk_interleaved or kind not in ("attn_q", "attn_k"):
            return 0
        n = self._meta("attention.head_count")
        return (self._meta("attention.head_count_kv", None) or n) if kind == "attn_k" else n

    @property
    def file_type(self) -> str:
        """The file's quantization mix as llama.cpp names it (Q4_K_M, Q8_0, ...), or "GGUF" when unstated."""
        try:
            return LlamaFileType(int(self.metadata["general.file_type"])).name.removeprefix("MOSTLY_")
        except (KeyError, ValueError, TypeError):
            return "GGUF"

    @property
    def completes_text(self) -> bool:
        """A base model: no chat template in the file, so a message is completed as plain text after BOS (the load
        info says so, rather than a chat the model was never trained for)."""
        return not isinstance(self.metadata.get("tokenizer.chat_template"), str)

    @property
    def num_params(self) -> int:
        return sum(t.numel for n, t in self.tensors.items() if n not in _IGNORED)


# The widest embedding, MLP or head a model may claim: 16x the largest in use today, and small enough that a
# product of two stays far from 64-bit overflow
_MAX_WIDTH = 1 << 20


def _short(v: Any) -> str:
    """A metadata value for a message: repr, cut short (a hostile value may be a megabyte long)."""
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute`: rows (head, pair, half) back to (head, half, pair)."""
    if w.shape[0] % (2 * n_head):
        raise ModelLoadError(f"cannot un-permute a tensor of shape {w.shape} over {n_head} heads")
    rest = w.shape[1:]
    return np.ascontiguousarray(w.reshape(n_head, w.shape[0] // n_head // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape))


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
