"""Read a .gguf file: its header parsed, its tensors dequantized and renamed to Hugging Face names, and a ModelConfig
from its metadata (engine.io.gguf_config).

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
from engine.io.gguf_config import ConfigReader, arch_meta, short_repr
from engine.model.families import BY_GGUF_ARCH

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
                                 f"{short_repr(arch)}")
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

    def meta(self, key: str, default: Any = ...) -> Any:
        """`{arch}.{key}` from the metadata (`default` when absent; none given: absent is a ModelLoadError)."""
        return arch_meta(self.path, self.arch, self.metadata, key, default)

    def config(self) -> ModelConfig:
        """The model's config, every value it is built from checked first (engine.io.gguf_config): a hostile or
        damaged header is a ModelLoadError naming the key, never an allocation sized by it."""
        return ConfigReader(self.path, self.arch, self.metadata, self.tensors, self.read_raw).config()

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
        n = self.meta("attention.head_count")
        return (self.meta("attention.head_count_kv", None) or n) if kind == "attn_k" else n

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


def _unpermute(w: np.ndarray, n_head: int) -> np.ndarray:
    """Inverse of llama.cpp's `permute`: rows (head, pair, half) back to (head, half, pair)."""
    if w.shape[0] % (2 * n_head):
        raise ModelLoadError(f"cannot un-permute a tensor of shape {w.shape} over {n_head} heads")
    rest = w.shape[1:]
    return np.ascontiguousarray(w.reshape(n_head, w.shape[0] // n_head // 2, 2, *rest).swapaxes(1, 2).reshape(w.shape))
