"""engine.io.weights and engine.io.gguf_file on tiny random models built here (HF folders and GGUF files)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from engine.io.gguf_file import GGUFFile
from engine.io.weights import ModelLoadError, load_checkpoint, load_tokenizer

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
CORPUS = ["def add(a, b):\n    return a + b\n", "hello world, the quick brown fox", "print('hi') # comment"] * 20


# --- builders (also used by tests/engine/test_provision.py and tests/engine/test_hub.py) -------------------------------------------

def make_tokenizer() -> PreTrainedTokenizerFast:
    """A tiny byte-level BPE tokenizer with ChatML specials and a chat template."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(CORPUS, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT
    return fast


def make_hf_model(arch: str, vocab: int, **kw):
    """A tiny random Llama (GQA, untied) or Qwen2 (q/k/v biases, tied embeddings) model."""
    common = dict(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, bos_token_id=0,
                  eos_token_id=2)
    common.update(kw)
    torch.manual_seed(0)
    if arch == "llama":
        return LlamaForCausalLM(LlamaConfig(**{"tie_word_embeddings": False, **common})).eval()
    return Qwen2ForCausalLM(Qwen2Config(**{"tie_word_embeddings": True, "rope_theta": 1e6, **common})).eval()


def save_hf_folder(folder: Path, arch: str = "llama", **kw) -> tuple[Path, torch.nn.Module]:
    tok = make_tokenizer()
    model = make_hf_model(arch, len(tok), **kw)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder, model


_GGUF_NAMES = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
               "lm_head.weight": "output.weight"}
_GGUF_LAYER = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
               "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
               "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
               "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
               "self_attn.v_proj.bias": "attn_v.bias", "mlp.gate_proj.weight": "ffn_gate.weight",
               "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}


def gguf_name(hf: str) -> str:
    if hf in _GGUF_NAMES:
        return _GGUF_NAMES[hf]
    _, _, i, rest = hf.split(".", 3)
    return f"blk.{i}.{_GGUF_LAYER[rest]}"


def llamacpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's converter does to q/k rows of `llama` models (written from its description)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


PARTS = {"attn_k": "Q5_0", "attn_v": "Q4_0", "ffn_gate": "Q4_0"}  # write_gguf's "parts": these, the rest Q8_0


def write_gguf(path: Path, model, tok: PreTrainedTokenizerFast | None, qtype: str = "F32",
               rope_freqs: np.ndarray | None = None) -> Path:
    """Export an HF model the way llama.cpp would: renamed, q/k permuted for llama, 2-D weights in `qtype`
    ("F32", "F16", "Q8_0", "mixed": F16 attention, Q8_0 MLP/embeddings, or "parts": q, k, v as Q8_0, Q5_0, Q4_0
    and the MLP's gate as Q4_0, so the fused layers are made of parts of different types), norms and biases in F32."""
    cfg = model.config
    arch = cfg.model_type
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_freq_base(float(cfg.rope_parameters["rope_theta"]) if getattr(cfg, "rope_parameters", None)
                         else float(cfg.rope_theta))
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if tok is not None:
        spec = json.loads(tok.backend_tokenizer.to_str())
        vocab = spec["model"]["vocab"]
        tokens = sorted(vocab, key=vocab.get)
        merges = [m if isinstance(m, str) else " ".join(m) for m in spec["model"]["merges"]]
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("qwen2" if arch == "qwen2" else "llama-bpe")
        w.add_token_list(tokens)
        w.add_token_types([3 if t in SPECIALS else 1 for t in tokens])
        w.add_token_merges(merges)
        w.add_bos_token_id(vocab["<|endoftext|>"])
        w.add_eos_token_id(vocab["<|im_end|>"])
        w.add_chat_template(CHAT)
    if rope_freqs is not None:
        w.add_tensor("rope_freqs.weight", rope_freqs.astype(np.float32))
    for hf, t in model.state_dict().items():
        if hf == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        name = gguf_name(hf)
        arr = t.detach().float().numpy().copy()
        if arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = cfg.num_attention_heads if "attn_q" in name else cfg.num_key_value_heads
            arr = llamacpp_permute(arr, heads)
        kind = {"mixed": "F16" if "attn" in name else "Q8_0", "parts": PARTS.get(name.split(".")[-2], "Q8_0")}.get(qtype, qtype)
        if arr.ndim == 1 or kind == "F32":
            w.add_tensor(name, arr)
        elif kind == "F16":
            w.add_tensor(name, arr.astype(np.float16))
        else:
            t = gguf.GGMLQuantizationType[kind]
            w.add_tensor(name, gguf.quants.quantize(arr, t), raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# --- safetensors folders ----------------------------------------------------------------------------------

def iter_hf(gf: GGUFFile):
    """Every tensor of the file that the model uses, by Hugging Face name, float32 in HF layout."""
    for name in gf.tensors:
        hf = gf.hf_name(name)
        if hf is not None:
            yield hf, gf.read(name)


def test_folder_loads_config_tensors_tokenizer_and_reports_progress(tmp_path):
    folder, model = save_hf_folder(tmp_path / "tiny-llama")
    seen = []
    ck = load_checkpoint(folder, progress=lambda s, f: seen.append((s, f)))
    assert ck.name == "tiny-llama" and ck.path == folder
    c = ck.config
    assert (c.arch, c.num_layers, c.num_heads, c.num_kv_heads, c.head_dim, c.vocab_size) == ("llama", 2, 4, 2, 8, len(ck.tokenizer))
    sd = model.state_dict()
    assert set(ck.tensors) == set(sd)
    for k, v in sd.items():
        assert torch.equal(ck.tensors[k], v), k
    assert seen and seen[-1] == ("Loading tiny-llama: 100%", 1.0)
    assert all("Loading tiny-llama" in s and 0.0 <= f <= 1.0 for s, f in seen)
    text = ck.tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False, add_generation_prompt=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


def test_loaded_tensors_are_copy_on_write_views_of_the_file(tmp_path):
    folder, model = save_hf_folder(tmp_path / "m")
    before = (folder / "model.safetensors").read_bytes()
    ck = load_checkpoint(folder)
    ck.tensors["model.norm.weight"].add_(1.0)  # must not write through to the checkpoint
    assert (folder / "model.safetensors").read_bytes() == before
    assert torch.equal(load_checkpoint(folder).tensors["model.norm.weight"], model.state_dict()["model.norm.weight"])


def test_sharded_folder(tmp_path):
    folder, model = save_hf_folder(tmp_path / "sharded")
    (folder / "model.safetensors").unlink()
    model.save_pretrained(folder, max_shard_size="20KB")
    shards = sorted(folder.glob("model-*-of-*.safetensors"))
    assert len(shards) > 2 and (folder / "model.safetensors.index.json").is_file()
    fracs = []
    ck = load_checkpoint(folder, progress=lambda s, f: fracs.append(f))
    assert len(fracs) == len(shards) + 1 and fracs == sorted(fracs)
    for k, v in model.state_dict().items():
        assert torch.equal(ck.tensors[k], v), k


def test_qwen2_folder_tied_with_biases_and_generation_config_eos(tmp_path):
    folder, model = save_hf_folder(tmp_path / "qwen", "qwen2")
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
    ck = load_checkpoint(folder)
    c = ck.config
    assert c.arch == "qwen2" and c.tie_word_embeddings and c.attention_bias and c.rope_theta == 1e6
    assert c.eos_token_ids == (2, 0)
    assert "lm_head.weight" not in ck.tensors
    assert torch.equal(ck.tensors["model.layers.1.self_attn.k_proj.bias"],
                       model.state_dict()["model.layers.1.self_attn.k_proj.bias"])


# --- errors -------------------------------------------------------------------------------------------------

def _raises(spec, *words):
    with pytest.raises(ModelLoadError) as e:
        load_checkpoint(spec)
    for w in words:
        assert w in str(e.value), str(e.value)
    return str(e.value)


def test_missing_path(tmp_path):
    _raises(tmp_path / "nope", str(tmp_path / "nope"), "no such file")


def test_folder_without_config(tmp_path):
    (tmp_path / "empty").mkdir()
    _raises(tmp_path / "empty", "empty", "no config.json")


def test_folder_without_safetensors(tmp_path):
    folder, _ = save_hf_folder(tmp_path / "m")
    (folder / "model.safetensors").unlink()
    _raises(folder, str(folder), "no model.safetensors")
    (folder / "pytorch_model.bin").write_bytes(b"x")
    _raises(folder, "only PyTorch .bin")


def test_truncated_and_corrupt_safetensors(tmp_path):
    folder, _ = save_hf_folder(tmp_path / "m")
    st = folder / "model.safetensors"
    data = st.read_bytes()
    st.write_bytes(data[: len(data) - 100])
    _raises(folder, str(st), "truncated")
    st.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all")
    _raises(folder, str(st), "corrupt")
    st.write_bytes(b"\xff" * 16)
    _raises(folder, str(st), "corrupt")
    st.write_bytes(data.replace(b'"shape":[64,32]', b'"shape":[64,33]', 1))  # header disagrees with its offsets
    _raises(folder, str(st), "corrupt")
    st.write_bytes(b"")
    _raises(folder, str(st), "corrupt", "0 bytes")


def test_non_float_weights_are_refused_by_name(tmp_path):
    """safetensors reads integer and fp8 tensors too; a quantized export must not load as if it were float."""
    from safetensors.torch import load_file, save_file

    folder, _ = save_hf_folder(tmp_path / "m")
    st = folder / "model.safetensors"
    sd = load_file(st)
    sd["model.layers.0.mlp.up_proj.weight"] = sd["model.layers.0.mlp.up_proj.weight"].to(torch.int8)
    save_file(sd, st, metadata={"format": "pt"})
    _raises(folder, str(folder), "model.layers.0.mlp.up_proj.weight is stored as int8")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_folders_load_exactly(tmp_path, dtype):
    folder, model = save_hf_folder(tmp_path / "half")
    model = model.to(dtype)
    model.save_pretrained(folder)
    ck = load_checkpoint(folder)
    for k, v in model.state_dict().items():
        assert ck.tensors[k].dtype == dtype and torch.equal(ck.tensors[k], v), k


def test_unsupported_architecture(tmp_path):
    folder, _ = save_hf_folder(tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "model_type": "gpt2"}))
    _raises(folder, "config.json", "unsupported model_type 'gpt2'")


def test_config_that_does_not_match_the_weights(tmp_path):
    folder, _ = save_hf_folder(tmp_path / "m")
    cfg = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "num_hidden_layers": 3}))
    _raises(folder, "weights do not match config.json", "missing model.layers.2.input_layernorm.weight")
    (folder / "config.json").write_text(json.dumps({**cfg, "intermediate_size": 48}))
    _raises(folder, "model.layers.0.mlp.gate_proj.weight has shape (64, 32), config implies (48, 32)")


def test_missing_shard(tmp_path):
    folder, model = save_hf_folder(tmp_path / "m")
    (folder / "model.safetensors").unlink()
    model.save_pretrained(folder, max_shard_size="20KB")
    victim = sorted(folder.glob("model-*-of-*.safetensors"))[1]
    victim.unlink()
    _raises(folder, victim.name, "missing")


def test_tokenizer_only_and_missing_tokenizer(tmp_path):
    folder, _ = save_hf_folder(tmp_path / "m")
    tok = load_tokenizer(folder)
    assert tok.decode(tok("def add(a, b):").input_ids) == "def add(a, b):"
    for f in folder.glob("tokenizer*"):
        f.unlink()
    with pytest.raises(ModelLoadError, match="no tokenizer files"):
        load_tokenizer(folder)


# --- GGUF ---------------------------------------------------------------------------------------------------

def test_gguf_llama_f32_undoes_the_qk_permutation_exactly(tmp_path):
    model = make_hf_model("llama", 300)
    path = write_gguf(tmp_path / "llama.gguf", model, None, "F32")
    gf = GGUFFile(path)
    c = gf.config()
    assert (c.arch, c.num_heads, c.num_kv_heads, c.head_dim, c.tie_word_embeddings, c.attention_bias) == ("llama", 4, 2, 8, False, False)
    got = dict(iter_hf(gf))
    sd = model.state_dict()
    assert set(got) == set(sd)
    for k, v in sd.items():
        assert np.array_equal(got[k], v.numpy()), k
    # and therefore the same logits through rotary attention
    clone = make_hf_model("llama", 300)
    clone.load_state_dict({k: torch.from_numpy(v) for k, v in got.items()})
    ids = torch.tensor([[5, 17, 42, 7, 99, 3]])
    with torch.no_grad():
        assert torch.allclose(clone(ids).logits, model(ids).logits, atol=1e-6)


def test_permutation_is_not_trivial(tmp_path):
    """Guards the test above: loading without un-permuting must differ."""
    model = make_hf_model("llama", 300)
    gf = GGUFFile(write_gguf(tmp_path / "llama.gguf", model, None, "F32"))
    raw = gf.read_raw("blk.0.attn_k.weight")
    assert not np.array_equal(raw, model.state_dict()["model.layers.0.self_attn.k_proj.weight"].numpy())


@pytest.mark.parametrize("qtype", ["F16", "Q8_0", "mixed"])
def test_gguf_llama_quantized_types_dequantize_close(tmp_path, qtype):
    model = make_hf_model("llama", 300)
    gf = GGUFFile(write_gguf(tmp_path / f"{qtype}.gguf", model, None, qtype))
    kinds = {t.qtype.name for t in gf.tensors.values()}
    assert kinds == ({"F32", "F16", "Q8_0"} if qtype == "mixed" else {"F32", qtype})
    sd = model.state_dict()
    for k, v in iter_hf(gf):
        ref = sd[k].numpy()
        assert v.dtype == np.float32 and v.shape == ref.shape
        assert np.abs(v - ref).max() <= 0.01 * np.abs(ref).max() + 1e-6, k  # both formats keep ~1% per block


def test_gguf_qwen2_checkpoint_with_tokenizer_and_chat_eos(tmp_path):
    tok = make_tokenizer()
    model = make_hf_model("qwen2", len(tok))
    path = write_gguf(tmp_path / "tiny-qwen.gguf", model, tok, "mixed")
    seen = []
    ck = load_checkpoint(path, progress=lambda s, f: seen.append(f))
    assert ck.name == "tiny-qwen" and seen[-1] == 1.0
    c = ck.config
    assert c.arch == "qwen2" and c.tie_word_embeddings and c.attention_bias and c.rope_theta == 1e6
    assert c.rms_norm_eps == 1e-6 and c.max_position_embeddings == 128 and c.vocab_size == len(tok)
    vocab = tok.get_vocab()
    assert c.eos_token_ids == (vocab["<|im_end|>"], vocab["<|endoftext|>"])
    assert c.bos_token_id == vocab["<|endoftext|>"]
    assert "lm_head.weight" not in ck.tensors
    sd = model.state_dict()
    assert torch.equal(ck.tensors["model.layers.0.self_attn.q_proj.bias"], sd["model.layers.0.self_attn.q_proj.bias"])
    t = ck.tokenizer
    assert t.chat_template == CHAT
    text = "def add(a, b):\n    return a + b"
    assert t.decode(t.encode(text)) == text
    msgs = [{"role": "user", "content": "hi"}]
    assert t.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True) == \
        tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert t.token_to_id("<|im_end|>") == vocab["<|im_end|>"]


def test_header_parse_matches_gguf_reader(tmp_path):
    tok = make_tokenizer()
    path = write_gguf(tmp_path / "m.gguf", make_hf_model("qwen2", len(tok)), tok, "mixed")
    ours, ref = GGUFFile(path), gguf.GGUFReader(path)
    for key, field in ref.fields.items():
        if not key.startswith("GGUF."):
            assert ours.metadata[key] == field.contents(), key
    assert [t.name for t in ref.tensors] == list(ours.tensors)
    for t in ref.tensors:
        mine = ours.tensors[t.name]
        assert (mine.qtype, mine.shape, mine.offset, mine.nbytes) == \
            (t.tensor_type, tuple(reversed(t.shape.tolist())), t.data_offset, t.n_bytes)
        assert np.array_equal(ours.read_raw(t.name), gguf.quants.dequantize(t.data, t.tensor_type)), t.name


def test_llama3_rope_freqs_become_rope_scaling(tmp_path):
    dim, theta, factor = 8, 500000.0, 32.0
    inv = 1.0 / theta ** (np.arange(0, dim, 2) / dim)
    wavelen = 2 * math.pi / inv
    smooth = (8192 / wavelen - 1) / 3
    freqs = np.where(wavelen < 2048, 1.0, np.where(wavelen > 8192, factor, 1 / ((1 - smooth) / factor + smooth)))
    model = make_hf_model("llama", 300, rope_theta=theta)
    gf = GGUFFile(write_gguf(tmp_path / "l3.gguf", model, None, "F32", rope_freqs=freqs))
    c = gf.config()
    assert c.rope_scaling == {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 8192}
    assert "rope_freqs.weight" not in dict(iter_hf(gf))
    bad = GGUFFile(write_gguf(tmp_path / "odd.gguf", model, None, "F32", rope_freqs=np.linspace(1, 3, dim // 2)))
    with pytest.raises(ModelLoadError, match="rope_freqs does not match"):
        bad.config()


def test_corrupt_truncated_and_unsupported_gguf(tmp_path):
    tok = make_tokenizer()
    path = write_gguf(tmp_path / "m.gguf", make_hf_model("qwen2", len(tok)), tok, "F32")
    data = path.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 64])
    _raises(cut, str(cut), "truncated")
    head = tmp_path / "head.gguf"
    head.write_bytes(data[:200])
    _raises(head, str(head), "truncated")
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + data[4:])
    _raises(bad, str(bad), "not a GGUF file")
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    _raises(empty, str(empty), "empty")
    w = gguf.GGUFWriter(str(tmp_path / "gpt2.gguf"), "gpt2")
    w.add_tensor("token_embd.weight", np.zeros((4, 8), np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    _raises(tmp_path / "gpt2.gguf", "gpt2.gguf", "unsupported architecture 'gpt2'")


def test_string_arrays_decode_lazily_and_compare_raw():
    import struct

    from engine.io.gguf_file import StringArray

    words = ["a", "<|im_end|>", "ü🙂", "", "<|im_end|>x"]
    raw, starts = b"", []
    for w in words:
        starts.append(len(raw))
        raw += struct.pack("<Q", len(w.encode())) + w.encode()
    arr = StringArray(raw, starts)
    assert "items" not in vars(arr)  # nothing decoded by comparing or searching
    assert arr == StringArray(bytes(raw), list(starts)) and arr != StringArray(raw[:-1] + b"y", starts)
    assert arr.find("<|im_end|>") == 1 and arr.find("<|im_end|>x") == 4 and arr.find("x") is None
    assert "items" not in vars(arr)
    assert arr == words and list(arr) == words and arr[2] == "ü🙂" and len(arr) == 5
