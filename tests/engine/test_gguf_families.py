"""Qwen3, Gemma 3, Phi-3, SmolLM3 and Granite GGUFs as llama.cpp writes them: tiny random models built with transformers' own classes,
converted by llama.cpp's own convert_hf_to_gguf.py (f32), read by our GGUF loader and run on the quantized-kernel
path. Their logits equal transformers' within a stated tolerance (deep enough to cross the sliding windows), and
greedy speculation equals plain decoding.

The converter is in the llama.cpp source tree that ../shared/bench/llama_cpp_build.sh fetches into
${SPECLENS_PEER_DIR:-~/.cache/speclens-peer}. Without it (a clone outside the project's workspace) the tests are
skipped with that reason, except under CI=true, where they fail.
"""
from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from engine.api.config import CacheConfig, SamplingParams, SpecParams
from engine.io.gguf_file import GGUFFile
from engine.io.gguf_model import build_model
from engine.io.gguf_tokenizer import tokenizer_from_gguf
from engine.io.loading import load_engine
from engine.io.weights import load_checkpoint
from engine.model.kv_cache import BlockManager, KVPool
from engine.model.transformer import Transformer
from tests.llama_server import llama_server

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT.parent / "shared" / "bench" / "llama_cpp_build.sh"
LLAMA_CPP = "llama.cpp-0.3.36"  # the version llama_cpp_build.sh fetches
MAX_LEN = 64
# fp32 weights and activations on both sides; only the order of the fp32 sums differs (measured: <= 5e-5 on
# logits of magnitude 15-30)
ATOL, RTOL = 2e-4, 1e-4

# Text for the tiny SentencePiece tokenizer the converter reads (it needs a real tokenizer beside the weights)
TEXT = ["The quick brown fox jumps over the lazy dog.", "def add(a, b):\n    return a + b",
        "Speculative decoding drafts tokens and a target verifies them.", "for i in range(10): print(i)",
        "Hello world! How are you today?", "import numpy as np", "café naïve 日本語"] * 20
SPECIALS = {"pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2}
COMMON = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 4, "rms_norm_eps": 1e-6,
          "tie_word_embeddings": False, **SPECIALS}
FAMILIES = {
    "qwen3": dict(model_type="qwen3", num_hidden_layers=2, num_key_value_heads=2, head_dim=32, rope_theta=1e6,
                  max_position_embeddings=256, **COMMON),
    # 7 layers: windowed layers 0-4 and 6, layer 5 global (the default pattern of 6); window 8, well inside a pass
    "gemma3": dict(model_type="gemma3_text", num_hidden_layers=7, num_key_value_heads=1, head_dim=32,
                   rope_theta=1e6, rope_local_base_freq=1e4, query_pre_attn_scalar=32, sliding_window=8,
                   max_position_embeddings=256, **{**COMMON, "tie_word_embeddings": True}),
    # Phi-4-mini's shape: LongRoPE, RoPE on 3/4 of each head, fused qkv and gate_up; plus Phi-3-mini's window
    "phi3": dict(model_type="phi3", num_hidden_layers=2, num_key_value_heads=2, rope_theta=1e4,
                 max_position_embeddings=512, original_max_position_embeddings=64, partial_rotary_factor=0.75,
                 sliding_window=8, rope_scaling={"rope_type": "longrope",
                                                 "short_factor": [1.0 + 0.1 * i for i in range(6)],
                                                 "long_factor": [2.0 + 0.5 * i for i in range(6)]}, **COMMON),
    # 4 layers: the last attends without RoPE (transformers' default interval, which llama.cpp hard-codes)
    "smollm3": dict(model_type="smollm3", num_hidden_layers=4, num_key_value_heads=2, rope_theta=2e6,
                    max_position_embeddings=256, **COMMON),
    # Granite's four multipliers, each away from 1 (and the attention one from 1/sqrt(head_dim))
    "granite": dict(model_type="granite", num_hidden_layers=2, num_key_value_heads=2, max_position_embeddings=256,
                    embedding_multiplier=12.0, attention_multiplier=0.09, residual_multiplier=0.22,
                    logits_scaling=8.0, **COMMON),
}
IDS = [2] + [(7 * i + 11) % 300 + 4 for i in range(39)]  # 40 tokens: five windows of 8


def llama_cpp_tree() -> Path:
    """The llama.cpp source tree holding convert_hf_to_gguf.py, fetched by the build script when missing."""
    peer = Path(os.environ.get("SPECLENS_PEER_DIR") or Path.home() / ".cache" / "speclens-peer")
    tree = peer / LLAMA_CPP
    if not (tree / "convert_hf_to_gguf.py").is_file():
        if not BUILD_SCRIPT.exists():
            why = (f"llama.cpp's convert_hf_to_gguf.py is not in {tree}, and {BUILD_SCRIPT}, which fetches it, is "
                   "not beside this checkout (it belongs to the project's workspace, not to the repository)")
            if os.environ.get("CI"):
                pytest.fail(why)  # CI's workspace always has it: its absence there must not pass as a skip
            pytest.skip(why)
        build = subprocess.run([str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=1500,
                               check=False)
        assert build.returncode == 0, f"llama.cpp was not fetched and built: {build.stderr[-800:]}"
    assert (tree / "convert_hf_to_gguf.py").is_file(), f"no convert_hf_to_gguf.py in {tree}"
    return tree


def sentencepiece_model(folder: Path):
    """A small SentencePiece BPE tokenizer (byte fallback), saved as the folder's tokenizer.model."""
    import sentencepiece as spm

    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(TEXT), model_writer=buf, vocab_size=320, model_type="bpe",
                                   byte_fallback=True, character_coverage=1.0, hard_vocab_limit=False,
                                   pad_id=0, eos_id=1, bos_id=2, unk_id=3, add_dummy_prefix=False, minloglevel=2,
                                   # llama.cpp marks it in a model named Phi-3, and refuses a vocabulary without it
                                   user_defined_symbols=["<|endoftext|>"])
    (folder / "tokenizer.model").write_bytes(buf.getvalue())
    return spm.SentencePieceProcessor(model_proto=buf.getvalue())


def hf_model(cfg: dict, folder: Path, seed: int = 0):
    """A transformers model with random weights, saved with its tokenizer. Norm weights are random too (around 1,
    or around 0 for Gemma, which scales by 1 + w), so a norm left out or misplaced shows in the logits."""
    from transformers import AutoConfig, AutoModelForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    sp = sentencepiece_model(folder)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**cfg, vocab_size=sp.vocab_size()),
                                             dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.normal_(0.0 if cfg["model_type"].startswith("gemma") else 1.0, 0.1)
            else:
                p.normal_(0.0, 0.5 if "embed" in name or "lm_head" in name else 0.3)
    model.save_pretrained(folder)
    return model, sp


@pytest.fixture(scope="module")
def converter():
    return llama_cpp_tree() / "convert_hf_to_gguf.py"


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, converter, tmp_path_factory):
    """(name, transformers model, SentencePiece processor, GGUF path) of one family."""
    name = request.param
    folder = tmp_path_factory.mktemp(name)
    model, sp = hf_model(FAMILIES[name], folder)
    out = folder / f"{name}.gguf"
    run = subprocess.run([sys.executable, str(converter), str(folder), "--outfile", str(out), "--outtype", "f32"],
                         capture_output=True, text=True, timeout=600, check=False)
    assert run.returncode == 0, f"convert_hf_to_gguf.py failed on {name}: {run.stderr[-1500:]}"
    return name, model, sp, out


def logits(model, ids: list[int], steps: bool = False) -> torch.Tensor:
    """(T, V): one pass over ids, or one decode step per token."""
    cfg = model.cfg
    pool = KVPool(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, BlockManager(8, 16, MAX_LEN), torch.float32, "cpu")
    pool.manager.allocate(0)
    if not steps:
        start, end = pool.manager.append(0, len(ids))
        return model(torch.tensor(ids), start, pool.view(0, start, end))
    out = []
    for t in ids:
        start, end = pool.manager.append(0, 1)
        out.append(model(torch.tensor([t]), start, pool.view(0, start, end)))
    return torch.cat(out)


def test_the_config_carries_each_familys_features(family):
    name, hf, _, path = family
    cfg = GGUFFile(path).config()
    assert cfg.arch == name and cfg.num_layers == hf.config.num_hidden_layers and cfg.norm_offset == 0.0
    if name == "qwen3":
        assert cfg.qk_norm and not cfg.sandwich_norm and cfg.activation == "silu" and cfg.sliding_window is None
    if name == "gemma3":
        assert cfg.qk_norm and cfg.sandwich_norm and cfg.activation == "gelu_tanh" and cfg.embedding_scale == 8.0
        assert cfg.sliding_window == 8 and cfg.window_layers == (True,) * 5 + (False, True)
        assert cfg.rope_local_theta == 1e4 and cfg.rope_theta == 1e6 and cfg.tie_word_embeddings
    if name == "phi3":
        assert cfg.rotary_dim == 12 and cfg.head_dim == 16 and cfg.sliding_window == 8 and all(cfg.window_layers)
        rs = cfg.rope_scaling
        assert rs["rope_type"] == "longrope" and rs["original_max_position_embeddings"] == 64
        assert cfg.max_position_embeddings == 64  # capped where the short factors end
        torch.testing.assert_close(torch.tensor(rs["short_factor"]), torch.tensor(FAMILIES["phi3"]["rope_scaling"][
            "short_factor"]))
    assert cfg.rotated == ((True, True, True, False) if name == "smollm3" else (True,) * cfg.num_layers)
    if name == "granite":
        scales = (cfg.embedding_scale, cfg.attn_scale, cfg.residual_scale, cfg.logit_scale)
        assert scales == pytest.approx((12.0, 0.09, 0.22, 8.0), rel=1e-6)  # stored as f32
    else:
        assert (cfg.residual_scale, cfg.logit_scale) == (1.0, 1.0)


@pytest.mark.parametrize("path_kind", ["torch", "stack", "dequantized"])
def test_logits_equal_transformers_in_one_pass_and_in_decode_steps(family, path_kind):
    """Every path: the quantized-kernel model with its torch decoder or the C++ stack (where it takes the model),
    and the dequantized weights under their Hugging Face names (how a GGUF loads on a GPU)."""
    name, hf, _, path = family
    with torch.no_grad():
        ref = hf(torch.tensor([IDS])).logits[0]  # (T, V)
    if path_kind == "dequantized":
        ck = load_checkpoint(path)
        model = Transformer.from_state_dict(ck.config, ck.tensors, torch.float32, "cpu", MAX_LEN)
    else:
        model = build_model(GGUFFile(path), MAX_LEN, act="fp32")
    if path_kind == "torch":
        model.stack = None
    if path_kind == "stack":  # every family: SmolLM3's NoPE layers by angle zero, Granite's residual scaled
        assert model.stack is not None, name
    one_pass = logits(model, IDS)
    torch.testing.assert_close(one_pass, ref, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(logits(model, IDS, steps=True), ref, atol=ATOL, rtol=RTOL)


def test_the_int8_path_picks_transformers_tokens(family):
    """The engine's default path rounds activations to int8 per block of 32: its logits stay near, its choices
    on this model the same."""
    _, hf, _, path = family
    with torch.no_grad():
        ref = hf(torch.tensor([IDS])).logits[0]
    fast = logits(build_model(GGUFFile(path), MAX_LEN, act="int8"), IDS)
    assert (fast - ref).abs().max() < 0.05 * ref.abs().max()
    assert (fast.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_greedy_speculative_equals_plain(family, drafter):
    name, _, _, path = family
    engine = load_engine(str(path), str(path) if drafter == "model" else None, device="cpu",
                         cache=CacheConfig(max_seq_len=MAX_LEN))
    engine.eos_ids = set()  # random weights: run to the length limit
    greedy = SamplingParams(max_new_tokens=40)
    for prompt in (IDS[:5], [2, 42, 43, 7, 42, 43, 7, 42]):
        engine.reset()
        *_, plain = engine.generate(prompt, greedy, SpecParams(enabled=False))
        for k in (1, 4):
            engine.reset()
            *_, spec = engine.generate(prompt, greedy, SpecParams(k=k, drafter=drafter))
            assert spec.token_ids == plain.token_ids, (name, drafter, k)


@pytest.fixture(scope="module")
def llama_server_bin(converter) -> Path:
    """llama-server, built by the workspace's script (at once when already built)."""
    if not BUILD_SCRIPT.exists():
        why = f"{BUILD_SCRIPT}, which builds llama-server, is not beside this checkout"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    build = subprocess.run([str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=1500, check=False)
    assert build.returncode == 0, f"llama.cpp did not build: {build.stderr[-800:]}"
    return Path(build.stdout.strip()) / "llama-server"


def test_the_gguf_tokenizer_splits_text_as_llama_cpp_does(family, llama_server_bin):
    """The same file's ids from llama-server's /tokenize (SentencePiece itself differs where llama.cpp does: it
    adds the space prefix the converter leaves unstated, and does not collapse runs of spaces)."""
    import httpx

    name, _, _, path = family
    tok = tokenizer_from_gguf(path, GGUFFile(path).metadata)
    with llama_server(llama_server_bin, path, "-t", "1", "-c", "64", up_within_s=120) as url:
        for text in ("The quick brown fox", "def add(a, b):\n    return a + b", "naïve café 日本語 🙂", "x  y",
                     " leading space", "end<|endoftext|>next"):
            theirs = httpx.post(f"{url}/tokenize", json={"content": text, "add_special": False}).json()["tokens"]
            ids = tok.encode(text, add_special_tokens=False)
            assert ids == theirs, (name, text)
            if "<|" not in text:  # after a special token the space prefix starts a new piece, as in llama.cpp
                assert tok.decode(ids) == text, (name, text)
