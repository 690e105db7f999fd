"""engine.model.families: which families run, which are refused and why, and Mistral's sliding window run exactly."""
from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from engine.api.config import CacheConfig, ModelConfig, SamplingParams, SpecParams
from engine.api.errors import ContextFullError
from engine.io.weights import ModelLoadError, load_checkpoint
from engine.model import families
from engine.model.gguf_refusal import gguf_refusal
from engine.model.transformer import Transformer
from engine.runtime.engine import Engine
from tests.tiny import LLAMA32_TINY, QWEN2_TINY, VOCAB, hf_model, state_dict, tiny_tokenizer

WINDOW = 24
MISTRAL_TINY = dict(
    model_type="mistral", vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=10000.0,
    max_position_embeddings=512, sliding_window=WINDOW, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
)


# --- the sliding window -----------------------------------------------------------------------------------------

def test_mistral_windows_every_layer_and_keeps_its_context():
    c = ModelConfig.from_hf(MISTRAL_TINY)
    assert (c.arch, c.max_position_embeddings, c.sliding_window, c.window_layers) == ("mistral", 512, WINDOW,
                                                                                       (True, True))
    assert c.context_note == ""
    wide = ModelConfig.from_hf(dict(MISTRAL_TINY, sliding_window=4096))  # a window past the context masks nothing
    assert (wide.max_position_embeddings, wide.sliding_window, wide.context_note) == (512, 4096, "")
    unset = ModelConfig.from_hf(dict(MISTRAL_TINY, sliding_window=None))  # Mistral v0.2 on: no window
    assert unset.max_position_embeddings == 512 and unset.sliding_window is None and not any(unset.windowed)


def test_window_flags_are_checked_when_a_config_is_made():
    small = dict(vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=2, num_heads=1, num_kv_heads=1)
    with pytest.raises(ValueError, match="window_layers marks windowed layers but sliding_window is not set"):
        ModelConfig(**small, window_layers=(True, False))
    with pytest.raises(ValueError, match="window_layers has 1 flags for 2 layers"):
        ModelConfig(**small, sliding_window=4, window_layers=(True,))
    with pytest.raises(ValueError, match="sliding_window must be >= 1"):
        ModelConfig(**small, sliding_window=0, window_layers=(True, True))


def test_the_window_changes_transformers_output_past_it():
    """What the real window is for: past it, transformers' Mistral differs from full attention."""
    hf = hf_model(MISTRAL_TINY, seed=0)
    ids = torch.randint(3, VOCAB, (1, 2 * WINDOW), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        windowed = hf(ids).logits[0]
        hf.config.sliding_window = None
        full = hf(ids).logits[0]
    torch.testing.assert_close(windowed[:WINDOW], full[:WINDOW], atol=1e-5, rtol=1e-5)
    assert (windowed[WINDOW:] - full[WINDOW:]).abs().max() > 1e-2


def test_mistral_greedy_equals_transformers_past_the_window_and_never_runs_past_the_context():
    hf = hf_model(MISTRAL_TINY, seed=0)
    cfg = ModelConfig.from_hf(MISTRAL_TINY)
    model = Transformer.from_state_dict(cfg, state_dict(hf), torch.float32, "cpu")
    context = 3 * WINDOW
    engine = Engine(model, tiny_tokenizer(), cache=CacheConfig(block_size=8, max_seq_len=context), eos_ids=set())
    assert engine.max_seq_len == context
    prompt = torch.randint(3, VOCAB, (8,), generator=torch.Generator().manual_seed(1)).tolist()
    *_, summary = engine.generate(prompt, SamplingParams(max_new_tokens=100), SpecParams(enabled=False))
    assert len(prompt) + len(summary.token_ids) == context  # stopped by the context, not by max_new_tokens
    ref = list(prompt)
    with torch.no_grad():
        while len(ref) < context:  # transformers' own greedy, windowed attention and all
            ref.append(int(hf(torch.tensor([ref])).logits[0, -1].argmax()))
    assert list(summary.token_ids) == ref[len(prompt):]
    with pytest.raises(ContextFullError):
        list(engine.generate(ref, SamplingParams(max_new_tokens=4), SpecParams(enabled=False)))
    with pytest.raises(ValueError, match="exceeds the target model's max_position_embeddings"):
        Engine(model, tiny_tokenizer(), cache=CacheConfig(max_seq_len=1024))


def test_loading_a_windowed_folder_keeps_its_context(tmp_path):
    hf_model(MISTRAL_TINY, seed=0).save_pretrained(tmp_path)
    stages = []
    ck = load_checkpoint(tmp_path, lambda s, f: stages.append(s))
    assert ck.config.max_position_embeddings == 512 and ck.config.sliding_window == WINDOW
    assert not any("capped" in s for s in stages)
    from engine.io.hub import describe

    listed = describe(tmp_path, "folder")  # the picker and speclens-models show the whole context, with no caveat
    assert listed.context_limit == 512 and listed.note == "" and listed.runnable


def test_qwen2_window_counts_only_when_its_layers_use_it():
    base = dict(QWEN2_TINY, sliding_window=16, max_window_layers=1)
    assert not any(ModelConfig.from_hf(base).windowed)  # use_sliding_window off: full attention
    windowed = ModelConfig.from_hf(dict(base, use_sliding_window=True))  # layer 1 of 2 is windowed
    assert (windowed.max_position_embeddings, windowed.sliding_window, windowed.window_layers) == (512, 16,
                                                                                                  (False, True))
    none_windowed = dict(base, use_sliding_window=True, max_window_layers=2)
    assert ModelConfig.from_hf(none_windowed).sliding_window is None
    listed = dict(base, use_sliding_window=True, layer_types=["sliding_attention", "full_attention"])
    assert ModelConfig.from_hf(listed).window_layers == (True, False)


# --- refused families and fields ----------------------------------------------------------------------------------

@pytest.mark.parametrize("model_type, words", [
    ("gemma2", "Gemma 2 needs logit soft-capping"),
    ("qwen3_moe", "Qwen3 MoE needs mixture-of-experts layers"),
])
def test_known_families_not_yet_runnable_are_refused_naming_what_they_lack(model_type, words):
    with pytest.raises(ValueError) as e:
        ModelConfig.from_hf(dict(LLAMA32_TINY, model_type=model_type))
    assert words in str(e.value)


def test_unknown_family_names_itself_and_what_runs():
    runs = "llama, qwen2, mistral, qwen3, gemma3_text, phi3, smollm3, granite"
    with pytest.raises(ValueError, match=rf"unsupported model_type 'gpt2': SpecLens runs {runs}$"):
        ModelConfig.from_hf(dict(LLAMA32_TINY, model_type="gpt2"))


@pytest.mark.parametrize("change, words", [
    (dict(attention_bias=True), "attention_bias: Llama attention bias includes an output-projection (o_proj) bias"),
    (dict(mlp_bias=True), "mlp_bias: Llama needs MLP biases"),
    (dict(hidden_act="gelu"), "hidden_act 'gelu': SpecLens implements SiLU- and GELU(tanh)-gated MLPs only"),
    (dict(rope_scaling={"rope_type": "yarn", "factor": 4.0}),
     "unsupported rope_scaling type 'yarn' (supported: llama3, linear, longrope)"),
    (dict(rope_scaling={"type": "longrope", "long_factor": [1.0] * 8}), "longrope short_factor must list 8 positive"),
    (dict(rope_scaling={"rope_type": "dynamic", "factor": 2.0}), "unsupported rope_scaling type 'dynamic'"),
    (dict(final_logit_softcapping=30.0), "final_logit_softcapping = 30.0: logit soft-capping"),
    (dict(attn_logit_softcapping=50.0), "attn_logit_softcapping = 50.0"),
    (dict(partial_rotary_factor=0.5), "partial_rotary_factor = 0.5: Llama applies RoPE to whole heads"),
    (dict(model_type="mistral", sliding_window=0), "sliding_window must be a positive integer, got 0"),
])
def test_fields_that_change_the_math_are_refused(change, words):
    with pytest.raises(ValueError) as e:
        ModelConfig.from_hf(dict(LLAMA32_TINY, **change))
    assert words in str(e.value)


def test_fields_a_family_ignores_are_ignored_as_transformers_does():
    # Mistral's and Qwen2's attention code fix their biases whatever config.json says
    assert not ModelConfig.from_hf(dict(MISTRAL_TINY, attention_bias=True)).attention_bias
    assert ModelConfig.from_hf(dict(QWEN2_TINY, attention_bias=False)).attention_bias
    assert not ModelConfig.from_hf(dict(LLAMA32_TINY, attention_bias=False, mlp_bias=False)).attention_bias


def test_a_tied_config_with_a_different_stored_head_is_refused(tmp_path):
    hf = hf_model(LLAMA32_TINY, seed=0)
    sd = {k: v.contiguous() for k, v in state_dict(hf).items()}
    (tmp_path / "config.json").write_text(json.dumps(LLAMA32_TINY))
    save_file(sd | {"lm_head.weight": sd["model.embed_tokens.weight"].clone()}, tmp_path / "model.safetensors")
    assert load_checkpoint(tmp_path).config.tie_word_embeddings  # the same head stored twice is fine
    other = torch.randn_like(sd["model.embed_tokens.weight"])
    save_file(sd | {"lm_head.weight": other}, tmp_path / "model.safetensors")
    with pytest.raises(ModelLoadError, match="ties the LM head to the embedding"):
        load_checkpoint(tmp_path)


# --- the table ----------------------------------------------------------------------------------------------------

def test_the_table_runs_exactly_the_families_whose_features_are_all_implemented():
    runnable = {f.model_type for f in families.FAMILIES if f.runnable}
    assert runnable == {"llama", "qwen2", "mistral", "qwen3", "gemma3_text", "phi3", "smollm3", "granite"}
    for fam in families.FAMILIES:
        assert fam.runnable == all(families.FEATURES[k].implemented for k in fam.features)
        if not fam.runnable:
            assert all(f.phrase in fam.refusal() for f in fam.missing) and fam.title in fam.refusal()
    assert families.BY_MODEL_TYPE["qwen2"].features == ("rms_norm", "qkv_bias", "silu", "sliding_window")


def test_gguf_architectures_are_judged_by_the_same_table():
    assert gguf_refusal("llama") is None and gguf_refusal("qwen2") is None
    assert gguf_refusal("qwen3") is None and gguf_refusal("gemma3") is None
    assert gguf_refusal("phi3") is None and gguf_refusal("smollm3") is None
    assert gguf_refusal("granite") is None
    assert gguf_refusal("gemma2") == ("Gemma 2 needs logit soft-capping, which SpecLens does not "
                                                "implement yet")
    assert gguf_refusal("gpt2") == "unsupported architecture 'gpt2' (SpecLens runs llama, qwen2, qwen3, " \
                                            "gemma3, phi3, smollm3, granite)"


def test_a_gguf_of_a_known_family_not_yet_runnable_is_refused_naming_what_it_lacks(tmp_path):
    import gguf
    import numpy as np

    from engine.io.gguf_file import GGUFFile

    w = gguf.GGUFWriter(str(tmp_path / "q3.gguf"), "qwen3moe")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelLoadError, match=r"q3.gguf: Qwen3 MoE needs mixture-of-experts layers, which SpecLens"):
        GGUFFile(tmp_path / "q3.gguf").config()


def small_gguf(path, arch: str, keys: dict, tensors: tuple[str, ...] = ()):
    """A GGUF header of `arch` (4 heads of 16) with extra metadata keys and extra (tiny) tensors."""
    import gguf
    import numpy as np

    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_embedding_length(64)
    w.add_head_count(4)
    for key, value in keys.items():
        (w.add_float32 if isinstance(value, float) else w.add_uint32)(f"{arch}.{key}", value)
    for name in ("token_embd.weight", *tensors):
        w.add_tensor(name, np.zeros((4, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("arch, keys, tensors, words", [
    ("llama", {"expert_count": 8}, ("blk.0.ffn_gate_exps.weight",), "Llama GGUF needs mixture-of-experts layers,"),
    # per-head q/k norms run in Qwen3 and Gemma 3; a Qwen2 has none, so its file's are math it would leave out
    ("qwen2", {}, ("blk.0.attn_q_norm.weight", "blk.0.attn_k_norm.weight"),
     "Qwen2 GGUF holds tensors SpecLens has no place for (blk.0.attn_q_norm.weight"),
    ("llama", {}, ("blk.0.post_ffw_norm.weight",), "Llama GGUF holds tensors SpecLens has no place for"),
    ("llama", {}, ("blk.0.attn_output.bias",), "needs an output-projection (o_proj) bias,"),
    ("llama", {}, ("blk.0.ffn_up.bias",), "needs MLP biases,"),
    ("llama", {"final_logit_softcapping": 30.0}, (), "needs logit soft-capping,"),
    # Granite's scalars in a file of another architecture: llama.cpp's llama ignores them, so which model is meant?
    ("llama", {"embedding_scale": 12.0}, (), ("Llama GGUF sets scaling multipliers (embedding/attention/residual/"
                                              "logit), which the Llama architecture does not have")),
    ("llama", {"attention.scale": 0.5}, (), "sets scaling multipliers"),
    ("llama", {}, ("blk.0.mystery.weight",), "holds tensors SpecLens has no place for (blk.0.mystery.weight)"),
])
def test_gguf_metadata_and_tensors_that_change_the_math_are_refused(tmp_path, arch, keys, tensors, words):
    from engine.io.gguf_file import GGUFFile

    gf = GGUFFile(small_gguf(tmp_path / "m.gguf", arch, keys, tensors))
    with pytest.raises(ModelLoadError) as e:
        gf.config()
    assert words in str(e.value)


def test_gguf_values_that_keep_the_math_are_not_refused(tmp_path):
    from engine.io.gguf_file import GGUFFile

    neutral = {"expert_count": 0, "rope.dimension_count": 16, "attention.scale": 0.25, "embedding_scale": 1.0}
    gf = GGUFFile(small_gguf(tmp_path / "m.gguf", "llama", neutral, ("rope_freqs.weight", "blk.0.attn_q.bias")))
    assert gguf_refusal(gf.arch, gf.metadata, gf.tensors) is None
