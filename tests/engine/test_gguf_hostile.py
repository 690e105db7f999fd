"""A GGUF's header is untrusted: every metadata value the loader sizes anything by is checked first, and a bad one
is a ModelLoadError naming the file and the key, never a ZeroDivisionError, a KeyError or gigabytes allocated."""
from __future__ import annotations

import struct
import time
from pathlib import Path

import gguf
import numpy as np
import pytest

from engine.api.errors import ModelLoadError
from engine.io.gguf_file import GGUFFile
from engine.io.weights import load_checkpoint

H, F, HEADS, KV, LAYERS, VOCAB = 32, 64, 4, 2, 2, 40
_DEFAULT = object()


def tensors(ffn: int = F, layers: int = LAYERS) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    hd = H // HEADS
    out = {"token_embd.weight": (VOCAB, H), "output_norm.weight": (H,), "output.weight": (VOCAB, H)}
    for i in range(layers):
        out |= {f"blk.{i}.attn_norm.weight": (H,), f"blk.{i}.ffn_norm.weight": (H,),
                f"blk.{i}.attn_q.weight": (HEADS * hd, H), f"blk.{i}.attn_k.weight": (KV * hd, H),
                f"blk.{i}.attn_v.weight": (KV * hd, H), f"blk.{i}.attn_output.weight": (H, HEADS * hd),
                f"blk.{i}.ffn_gate.weight": (ffn, H), f"blk.{i}.ffn_up.weight": (ffn, H),
                f"blk.{i}.ffn_down.weight": (H, ffn)}
    return {k: rng.standard_normal(v).astype(np.float32) for k, v in out.items()}


def write(path: Path, meta: dict | None = None, drop: tuple[str, ...] = (), ts: dict | None = None,
          arch: str = "llama") -> Path:
    """A tiny GGUF of a Llama-shaped arch; meta maps a key (after "<arch>.") to a value (None: left out), written
    with its Python type: str as a string, float as f32, int as u32 (u64 when it does not fit)."""
    values = {"block_count": LAYERS, "context_length": 128, "embedding_length": H, "feed_forward_length": F,
              "attention.head_count": HEADS, "attention.head_count_kv": KV, "rope.freq_base": 10000.0,
              "attention.layer_norm_rms_epsilon": 1e-5} | (meta or {})
    w = gguf.GGUFWriter(str(path), arch)
    for key, v in values.items():
        if v is None:
            continue
        full = f"{arch}.{key}"
        if isinstance(v, str):
            w.add_string(full, v)
        elif isinstance(v, float):
            w.add_float32(full, v)
        elif isinstance(v, list):
            w.add_array(full, v)
        elif v >= 2**32:
            w.add_uint64(full, v)
        else:
            w.add_uint32(full, v)
    for name, arr in (ts if ts is not None else tensors()).items():
        if name not in drop:
            w.add_tensor(name, arr)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    return path


def refuses(path: Path, *words: str) -> str:
    t0 = time.perf_counter()
    with pytest.raises(ModelLoadError) as e:
        load_checkpoint(str(path), dequantize=False)
    assert time.perf_counter() - t0 < 10  # nothing sized by the header before the check
    msg = str(e.value)
    assert str(path) in msg and "\n" not in msg, msg
    for w in words:
        assert w in msg, msg
    return msg


def test_the_valid_file_loads(tmp_path):
    ck = load_checkpoint(str(write(tmp_path / "ok.gguf")), dequantize=False)
    assert (ck.config.num_layers, ck.config.intermediate_size, ck.config.head_dim) == (LAYERS, F, H // HEADS)


@pytest.mark.parametrize("key,value,words", [
    ("attention.head_count", 0, ["llama.attention.head_count", "is 0"]),
    ("attention.head_count", "four", ["llama.attention.head_count", "must be an integer", "'four'"]),
    ("attention.head_count", None, ["llama.attention.head_count"]),
    ("attention.head_count_kv", 3, ["attention.head_count_kv"]),
    ("context_length", 0, ["llama.context_length", "is 0"]),
    ("context_length", 1.5, ["llama.context_length", "must be an integer"]),
    ("embedding_length", 2**31, ["llama.embedding_length", "2147483648"]),
    ("embedding_length", 64, ["llama.embedding_length", "token_embd.weight"]),
    ("block_count", 10**6, ["llama.block_count", "1000000"]),
    ("block_count", 3, ["blk.2."]),
    ("feed_forward_length", 96, ["blk.0.ffn_gate.weight", "feed_forward_length"]),
    ("attention.layer_norm_rms_epsilon", float("nan"), ["llama.attention.layer_norm_rms_epsilon"]),
    ("rope.freq_base", -1.0, ["llama.rope.freq_base"]),
    ("attention.key_length", 7, ["even"]),
    ("attention.head_count", [4, 4], ["llama.attention.head_count", "list"]),
])
def test_a_bad_metadata_value_names_its_key(tmp_path, key, value, words):
    refuses(write(tmp_path / "bad.gguf", {key: value}), *words)


def test_a_missing_tensor_is_named(tmp_path):
    refuses(write(tmp_path / "gap.gguf", drop=("blk.1.ffn_down.weight",)), "blk.1.ffn_down.weight")


def test_tensors_that_disagree_with_feed_forward_length(tmp_path):
    # the tensors are 96 wide, the metadata says 64: formerly loaded, then failed at the first generation
    refuses(write(tmp_path / "ffn.gguf", ts=tensors(ffn=96)), "feed_forward_length", "(96, 32)")


def test_a_bad_token_id_is_named(tmp_path):
    path = tmp_path / "eos.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for k, v in {"block_count": LAYERS, "embedding_length": H, "feed_forward_length": F,
                 "attention.head_count": HEADS, "attention.head_count_kv": KV}.items():
        w.add_uint32(f"llama.{k}", v)
    w.add_eos_token_id(10**6)
    for name, arr in tensors().items():
        w.add_tensor(name, arr)
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    refuses(path, "tokenizer.ggml.eos_token_id")


def _patch_first(data: bytes, old: bytes, new: bytes) -> bytes:
    at = data.index(old)
    return data[:at] + new + data[at + len(new):]


def test_a_string_array_claiming_more_entries_than_the_file_holds(tmp_path):
    path = tmp_path / "arr.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_array("tokenizer.ggml.tokens", ["a", "b"])
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    data = path.read_bytes()
    # array header: sub-type STRING (8), then count 2: claim 2**60 strings (formerly a list of that many was made)
    path.write_bytes(_patch_first(data, struct.pack("<IQ", 8, 2), struct.pack("<IQ", 8, 2**60)))
    t0 = time.perf_counter()
    with pytest.raises(ModelLoadError, match="truncated inside a string array"):
        GGUFFile(path)
    assert time.perf_counter() - t0 < 5


def test_arrays_nested_past_the_bound_are_refused(tmp_path):
    # a header of 20,000 arrays each holding the next: formerly a RecursionError
    path = tmp_path / "deep.gguf"
    depth = 20_000
    key = b"x"
    body = struct.pack("<Q", len(key)) + key + struct.pack("<I", 9)  # ARRAY
    body += struct.pack("<IQ", 9, 1) * depth + struct.pack("<IQ", 4, 0)
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + body)
    with pytest.raises(ModelLoadError, match="nests arrays deeper"):
        GGUFFile(path)


def test_a_tensor_with_too_many_dimensions_is_refused(tmp_path):
    path = write(tmp_path / "dims.gguf")
    data = path.read_bytes()
    name = b"output_norm.weight"
    # the tensor info: name length, name, then n_dims (1): claim 2**31 dimensions
    at = data.index(struct.pack("<Q", len(name)) + name) + 8 + len(name)
    path.write_bytes(data[:at] + struct.pack("<I", 2**31) + data[at + 4:])
    with pytest.raises(ModelLoadError, match="dimensions"):
        GGUFFile(path)


def test_a_path_that_does_not_exist_is_told_before_the_kernels_build(tmp_path, monkeypatch):
    from engine.cpu import ext
    from engine.service.loaders import default_loader

    def no_build(*a, **k):
        raise AssertionError("the kernels were built for a path that does not exist")

    monkeypatch.setattr(ext, "load", no_build)
    missing = tmp_path / "nowhere.gguf"
    with pytest.raises(ModelLoadError, match="no such file"):
        default_loader(str(missing), None, None, lambda s, f: None, lambda: False)
    with pytest.raises(ModelLoadError, match="no such file"):
        default_loader(str(write(tmp_path / "ok.gguf")), str(missing), None, lambda s, f: None, lambda: False)


def test_an_architecture_that_is_not_a_name_is_refused(tmp_path):
    path = tmp_path / "arch.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.kv_data[0].pop("general.architecture", None)
    w.add_array("general.architecture", list(range(50_000)))
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    msg = refuses(path, "general.architecture must be a short name")
    assert len(msg) < 300


def test_granites_multipliers_are_read_and_checked_where_they_enter(tmp_path):
    scales = {"embedding_scale": 12.0, "attention.scale": 0.0078125, "residual_scale": 0.22, "logit_scale": 8.0}
    cfg = GGUFFile(write(tmp_path / "g.gguf", scales, arch="granite")).config()
    got = (cfg.embedding_scale, cfg.attn_scale, cfg.residual_scale, cfg.logit_scale)
    assert got == pytest.approx((12.0, 0.0078125, 0.22, 8.0), rel=1e-6)
    assert GGUFFile(write(tmp_path / "d.gguf", arch="granite")).config().attn_scale == pytest.approx(8 ** -0.5)
    zero = GGUFFile(write(tmp_path / "z.gguf", {"attention.scale": 0.0}, arch="granite"))
    assert zero.config().attn_scale == pytest.approx(8 ** -0.5)  # llama.cpp reads 0 as unset too
    for key, bad in (("residual_scale", -1.0), ("logit_scale", 0.0), ("embedding_scale", float("inf")),
                     ("attention.scale", "x")):
        gf = GGUFFile(write(tmp_path / f"{key}.gguf", {**scales, key: bad}, arch="granite"))
        with pytest.raises(ModelLoadError, match=rf"granite\.{key} must be a finite number in \(0, 1e\+06\)"):
            gf.config()
