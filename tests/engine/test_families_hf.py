"""The families beyond Llama and Qwen2 on the torch path, from Hugging Face folders: tiny random models built with
transformers' own classes, saved, read back by SpecLens's loader, and checked against transformers (fp32, atol 1e-4)
for a long prefill, one-token steps and verify passes, deep enough to cross the sliding window; verify rows equal
plain steps bit for bit, and greedy speculation equals plain greedy. Fields that change the math and are not
implemented are refused by name."""
from __future__ import annotations

import json
import math

import pytest
import torch

from engine.api.config import CacheConfig, ModelConfig, SamplingParams, SpecParams
from engine.io.weights import ModelLoadError, load_checkpoint
from engine.model.kv_cache import BlockManager, KVPool
from engine.model.row_padding import pad_short_passes
from engine.model.step_graphs import StepGraphs
from engine.model.transformer import Transformer
from engine.runtime.engine import Engine
from tests.tiny import VOCAB, draft_weights, pass_and_steps, tiny_tokenizer

ATOL = 1e-4  # fp32 against transformers: the same math, summed in other orders
WINDOW = 8
LENGTH = 40  # positions scored: five windows
BASE = {"vocab_size": VOCAB, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "max_position_embeddings": 256,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "tie_word_embeddings": False}
FAMILIES = {
    "qwen3": dict(BASE, model_type="qwen3", rms_norm_eps=1e-6, rope_theta=1e6),
    "qwen3-windowed": dict(BASE, model_type="qwen3", use_sliding_window=True, sliding_window=WINDOW,
                           max_window_layers=1),
    # layers 0 and 2 windowed (pattern 2) with the local RoPE base; query_pre_attn_scalar not head_dim
    "gemma3": dict(BASE, model_type="gemma3_text", sliding_window=WINDOW, sliding_window_pattern=2,
                   rope_theta=1e6, rope_local_base_freq=1e4, query_pre_attn_scalar=24, tie_word_embeddings=True),
    # as Gemma 3 4B and up: linear RoPE scaling on the global layers only
    "gemma3-linear": dict(BASE, model_type="gemma3_text", sliding_window=WINDOW, sliding_window_pattern=3,
                          rope_theta=1e6, rope_local_base_freq=1e4, query_pre_attn_scalar=16,
                          rope_scaling={"rope_type": "linear", "factor": 8.0}, tie_word_embeddings=True),
    "phi3": dict(BASE, model_type="phi3", num_key_value_heads=4, sliding_window=WINDOW),
    # Phi-4-mini's shape: RoPE on 3/4 of each head, LongRoPE (short factors within original_max_position_embeddings)
    "phi4-mini": dict(BASE, model_type="phi3", partial_rotary_factor=0.75, original_max_position_embeddings=64,
                      rope_scaling={"type": "longrope", "short_factor": [1.0, 1.3, 1.9, 2.6, 4.0, 7.5],
                                    "long_factor": [2.0, 3.0, 5.0, 8.0, 13.0, 21.0]}, tie_word_embeddings=True),
    "mistral": dict(BASE, model_type="mistral", sliding_window=WINDOW),
    "qwen2-windowed": dict(BASE, model_type="qwen2", use_sliding_window=True, sliding_window=WINDOW,
                           max_window_layers=1),
    # the middle layer attends without RoPE (its no_rope_layers flag is 0)
    "smollm3": dict(BASE, model_type="smollm3", no_rope_layers=[1, 0, 1], rope_theta=2e6),
    # all four multipliers away from 1 (and the attention one away from 1/sqrt(head_dim)), so each one shows
    "granite": dict(BASE, model_type="granite", embedding_multiplier=12.0, attention_multiplier=0.09,
                    residual_multiplier=0.22, logits_scaling=8.0),
}


def hf_model(cfg: dict, seed: int = 0):
    """A transformers model of the family with random weights, norms included (so a norm offset left unfolded or a
    q/k norm left out shows)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    conf = AutoConfig.for_model(**cfg)
    model = AutoModelForCausalLM.from_config(conf, dtype=torch.float32, attn_implementation="eager").eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.2)
            else:
                p.normal_(0.0, 0.5 if "embed" in name or "lm_head" in name else 0.3)
    return model


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tmp_path_factory):
    """(name, the transformers model, ours loaded from its saved folder)."""
    hf = hf_model(FAMILIES[request.param])
    folder = tmp_path_factory.mktemp(request.param)
    hf.save_pretrained(folder)
    ck = load_checkpoint(folder)
    return request.param, hf, padded(Transformer.from_state_dict(ck.config, ck.tensors, torch.float32, "cpu", 256))


def padded(model: Transformer) -> Transformer:
    """The CPU's BLAS rounds a matmul by its row count, which the engine's CPU path avoids with its own kernels
    (engine.cpu.dense); the torch path's rows are made independent of the count as on a GPU whose library needs it
    (engine.model.row_padding), so what is tested is the rest: attention, windows, norms, RoPE."""
    pad_short_passes(model, probe=False)
    return model


def ids(n: int = LENGTH, seed: int = 1) -> list[int]:
    return torch.randint(3, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def pool_for(model: Transformer) -> KVPool:
    c = model.cfg
    pool = KVPool(c.num_layers, c.num_kv_heads, c.head_dim, BlockManager(32, 8, 256), torch.float32, "cpu")
    pool.manager.allocate(0)
    return pool


def feed(model: Transformer, pool: KVPool, toks: list[int]) -> torch.Tensor:
    start, end = pool.manager.append(0, len(toks))
    return model(torch.tensor(toks), start, pool.view(0, start, end))  # (T, V)


def ours_by_passes(model: Transformer) -> torch.Tensor:
    """LENGTH positions scored as the engine scores them: a 20-token prefill (the fused path), ten one-token steps,
    then two 5-token verify passes -> (LENGTH, V)."""
    toks, pool = ids(), pool_for(model)
    rows = [feed(model, pool, toks[:20])]
    rows += [feed(model, pool, [t]) for t in toks[20:30]]
    rows += [feed(model, pool, toks[30:35]), feed(model, pool, toks[35:40])]
    return torch.cat(rows)


def test_the_config_reads_the_family_features(family):
    name, hf, model = family
    c, hc = model.cfg, hf.config
    # the folder's config.json is in transformers 5's form (rope_parameters, per layer type for Gemma 3); FAMILIES
    # holds the older one (rope_theta, rope_scaling, rope_local_base_freq) that most published folders use
    assert ModelConfig.from_hf(FAMILIES[name]) == c
    windowed = [t == "sliding_attention" for t in getattr(hc, "layer_types", None) or []]
    if name in ("mistral", "phi3"):
        windowed = [True] * hc.num_hidden_layers
    assert list(c.windowed) == (windowed or [False] * c.num_layers)
    assert [b.attn.window for b in model.layers] == [WINDOW if w else None for w in c.windowed]
    assert c.qk_norm == name.startswith(("qwen3", "gemma3")) and c.sandwich_norm == name.startswith("gemma3")
    if name.startswith("gemma3"):
        assert (c.norm_offset, c.activation, c.embedding_scale) == (1.0, "gelu_tanh", 8.0)
        assert c.attn_scale == hc.query_pre_attn_scalar ** -0.5 and c.rope_local_theta == 1e4
        assert model.rope_local is not None and not torch.equal(model.rope_local.cos, model.rope.cos)
    elif name == "granite":
        assert (c.embedding_scale, c.attn_scale, c.residual_scale, c.logit_scale) == (12.0, 0.09, 0.22, 8.0)
        assert all(b.residual_scale == 0.22 for b in model.layers)
    else:
        assert (c.norm_offset, c.activation, c.embedding_scale, c.rope_local_theta) == (0.0, "silu", 1.0, None)
        assert model.rope_local is None and c.attn_scale == 1 / math.sqrt(16)
        assert (c.residual_scale, c.logit_scale) == (1.0, 1.0)
    assert [b.attn.rotates for b in model.layers] == ([True, False, True] if name == "smollm3" else [True] * 3)
    if name == "phi4-mini":
        assert c.rotary_dim == 12 and model.rope.cos.shape[1] == 12
        assert c.max_position_embeddings == 64  # where the short factors end
        assert c.rope_scaling["attention_factor"] == pytest.approx(math.sqrt(1 + math.log(4) / math.log(64)))
        assert "LongRoPE" in c.context_note
    else:
        assert c.rotary_dim == 16 and c.context_note == ""


def test_logits_equal_transformers_across_the_window(family):
    _, hf, model = family
    with torch.no_grad():
        ref = hf(torch.tensor([ids()])).logits[0]  # (LENGTH, V)
    ours = ours_by_passes(model)
    torch.testing.assert_close(ours, ref, atol=ATOL, rtol=0)
    assert torch.equal(ours.argmax(-1), ref.argmax(-1))


def test_verify_rows_equal_plain_steps_bit_for_bit(family):
    *_, model = family
    for n in (2, 5, 16):
        together, steps = pass_and_steps(model, ids(20, seed=2), ids(n, seed=3))
        assert torch.equal(together, steps), n


def test_fixed_shape_passes_window_their_bias(family):
    """The fixed-shape passes a CUDA graph replays (run uncaptured here) agree with transformers too, the window in
    their bias, and their rows equal steps bit for bit."""
    _, hf, model = family
    model.graphs = StepGraphs(capture=False)
    try:
        with torch.no_grad():
            ref = hf(torch.tensor([ids()])).logits[0]
        torch.testing.assert_close(ours_by_passes(model), ref, atol=ATOL, rtol=0)
        together, steps = pass_and_steps(model, ids(20, seed=2), ids(5, seed=3))
        assert torch.equal(together, steps)
    finally:
        model.graphs = None


def test_greedy_equals_transformers_and_speculation_equals_plain(family):
    _, hf, model = family
    cfg = model.cfg
    sd = {k: v for k, v in hf.state_dict().items() if not (cfg.tie_word_embeddings and k == "lm_head.weight")}
    draft = padded(Transformer.from_state_dict(cfg, draft_weights(sd, 0.03, 1), torch.float32, "cpu", 256))
    engine = Engine(model, tiny_tokenizer(), draft, cache=CacheConfig(block_size=8, max_seq_len=64), eos_ids=set())
    prompt, n = ids(6, seed=4), 30  # 36 positions: the window crossed four times over
    greedy = SamplingParams(max_new_tokens=n)
    *_, plain = engine.generate(prompt, greedy, SpecParams(enabled=False))
    ref = list(prompt)
    with torch.no_grad():
        while len(ref) < len(prompt) + n:
            ref.append(int(hf(torch.tensor([ref])).logits[0, -1].argmax()))
    assert list(plain.token_ids) == ref[len(prompt):]
    for k in (1, 4):
        engine.reset()
        *_, spec = engine.generate(prompt, greedy, SpecParams(k=k, drafter="model"))
        assert spec.token_ids == plain.token_ids, k
        assert spec.accepted > 0


def test_the_window_changes_the_answer_past_it():
    """What the real window guards against: the same weights with full attention differ past the window."""
    hf = hf_model(FAMILIES["mistral"])
    with torch.no_grad():
        windowed = hf(torch.tensor([ids()])).logits[0]
        hf.config.sliding_window = None
        full = hf(torch.tensor([ids()])).logits[0]
    torch.testing.assert_close(windowed[:WINDOW], full[:WINDOW], atol=1e-5, rtol=0)
    assert (windowed[WINDOW:] - full[WINDOW:]).abs().max() > 1e-2


# --- refusals -----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, change, words", [
    ("gemma3", {"hidden_activation": "gelu"}, "hidden_activation 'gelu': SpecLens implements SiLU- and GELU(tanh)"),
    ("qwen3", {"hidden_act": "gelu_new"}, "hidden_act 'gelu_new'"),
    ("gemma3", {"attn_logit_softcapping": 50.0}, "attn_logit_softcapping = 50.0: logit soft-capping"),
    ("gemma3", {"final_logit_softcapping": 30.0}, "final_logit_softcapping = 30.0: logit soft-capping"),
    ("gemma3", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ("gemma3", {"attention_bias": True}, "Gemma 3 attention bias includes an output-projection (o_proj) bias"),
    ("qwen3", {"attention_bias": True}, "Qwen3 attention bias includes an output-projection (o_proj) bias"),
    ("gemma3", {"sliding_window": None}, "Gemma 3 without a sliding_window"),
    ("gemma3", {"rope_parameters": {"sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
                                     "full_attention": {"rope_type": "default", "rope_theta": 1e6}}},
     "rope_type 'linear' on the sliding-window layers"),
    ("gemma3", {"layer_types": ["sliding_attention", "chunked_attention", "full_attention"]},
     "layer_types 'chunked_attention'"),
    ("qwen3", {"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "unsupported rope_scaling type 'yarn'"),
    ("phi3", {"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "unsupported rope_scaling type 'dynamic'"),
    ("phi4-mini", {"partial_rotary_factor": 1.5}, "partial_rotary_factor must be in (0, 1]"),
    ("phi4-mini", {"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 8, "long_factor": [1.0] * 8}},
     "longrope short_factor must list 6 positive factors"),
    ("phi4-mini", {"rope_scaling": {"type": "longrope", "short_factor": [1.0] * 5 + ["x"]}},
     "longrope short_factor must list 6 positive factors"),
    ("gemma3", {"query_pre_attn_scalar": "256"}, "query_pre_attn_scalar must be a positive number, got '256'"),
    ("gemma3", {"rope_scaling": {"rope_type": "linear"}}, "linear rope_scaling needs a positive factor, got None"),
])
def test_fields_that_change_the_math_are_refused_by_name(name, change, words):
    with pytest.raises(ValueError) as e:
        ModelConfig.from_hf(dict(FAMILIES[name], **change))
    assert words in str(e.value)


def test_a_vision_language_gemma_folder_is_refused_as_such():
    cfg = {"model_type": "gemma3", "text_config": dict(FAMILIES["gemma3"]), "vision_config": {}}
    with pytest.raises(ValueError, match="holds a vision-language model; SpecLens runs text-only"):
        ModelConfig.from_hf(cfg)


@pytest.mark.parametrize("model_type, words", [
    ("gemma2", "Gemma 2 needs logit soft-capping, which SpecLens does not implement yet"),
    ("qwen3_moe", "Qwen3 MoE needs mixture-of-experts layers, which SpecLens does not implement yet"),
])
def test_families_not_implemented_stay_refused(model_type, words):
    with pytest.raises(ValueError) as e:
        ModelConfig.from_hf(dict(BASE, model_type=model_type))
    assert words in str(e.value)


@pytest.mark.parametrize("name, change, words", [
    ("smollm3", {"use_sliding_window": True, "sliding_window": WINDOW},
     "use_sliding_window: SpecLens does not run SmolLM3 with a sliding window"),
    ("smollm3", {"no_rope_layers": [1, 0]}, "no_rope_layers must list a 0 or 1 per layer (3)"),
    ("smollm3", {"no_rope_layers": [1, 2, 1]}, "no_rope_layers must list a 0 or 1 per layer (3)"),
    ("granite", {"residual_multiplier": 0.0}, "residual_scale must be > 0"),
    ("granite", {"logits_scaling": "8"}, "logit_scale must be a number"),
    ("granite", {"attention_bias": True}, "Granite attention bias includes an output-projection (o_proj) bias"),
])
def test_the_new_features_fields_are_checked(name, change, words):
    with pytest.raises(ValueError) as e:
        ModelConfig.from_hf(dict(FAMILIES[name], **change))
    assert words in str(e.value)


def test_smollm3_states_its_nope_layers_by_interval_when_it_lists_none():
    cfg = dict(FAMILIES["smollm3"], num_hidden_layers=8)
    del cfg["no_rope_layers"]
    assert ModelConfig.from_hf(cfg).rotated == (True, True, True, False) * 2  # transformers' default: every 4th
    assert ModelConfig.from_hf(dict(cfg, no_rope_layer_interval=2)).rotated == (True, False) * 4
    assert ModelConfig.from_hf(dict(cfg, num_hidden_layers=3)).nope_layers == ()  # none within 3 layers


def test_nope_layers_and_multipliers_change_the_answer():
    """What the new features guard against: the same weights with every layer rotated, or without the
    multipliers, give other logits."""
    x = torch.tensor([ids()])
    for name, neutral in (("smollm3", {"no_rope_layers": [1, 1, 1]}),
                          ("granite", {"embedding_multiplier": 1.0, "attention_multiplier": 0.25,
                                       "residual_multiplier": 1.0, "logits_scaling": 1.0})):
        with torch.no_grad():
            ref = hf_model(FAMILIES[name])(x).logits[0]
            other = hf_model(dict(FAMILIES[name], **neutral))(x).logits[0]
        assert (ref - other).abs().max() > 1e-2, name


def test_weights_the_engine_has_no_place_for_are_refused(tmp_path):
    """An o_proj bias the config does not announce would be math left out: the folder is refused."""
    from safetensors.torch import save_file

    hf = hf_model(FAMILIES["qwen3"])
    sd = {k: v.contiguous() for k, v in hf.state_dict().items()}
    sd["model.layers.0.self_attn.o_proj.bias"] = torch.ones(64)
    (tmp_path / "config.json").write_text(json.dumps(FAMILIES["qwen3"]))
    save_file(sd, tmp_path / "model.safetensors")
    with pytest.raises(ModelLoadError, match=r"unexpected model.layers.0.self_attn.o_proj.bias"):
        load_checkpoint(tmp_path)


@pytest.mark.parametrize("name", ["gemma3", "smollm3", "granite"])
def test_on_the_cpu_kernels_a_new_family_runs_on_the_stack(tmp_path, name):
    """A folder placed on the CPU runs its matrices on the kernels and its short passes on the C++ stack (Gemma 3:
    q/k and sandwich norms, GELU, windows with their local RoPE; SmolLM3: a NoPE layer turned by angle zero;
    Granite: the scaled residual), and equals transformers."""
    from engine.cpu import ext
    from engine.io.loading import place

    if ext.load() is None:
        pytest.skip("the compiled kernels are not available here")
    hf = hf_model(FAMILIES[name])
    hf.save_pretrained(tmp_path)
    model = place(load_checkpoint(tmp_path), torch.float32, torch.device("cpu"), 256, int8=False)
    assert model.stack is not None and type(model.layers[0].attn.qkv).__name__ == "QuantLinear"
    with torch.no_grad():
        ref = hf(torch.tensor([ids()])).logits[0]
    torch.testing.assert_close(ours_by_passes(model), ref, atol=ATOL, rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("name", ["gemma3", "mistral", "phi4-mini"])
@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
def test_on_a_gpu_windowed_rows_equal_steps_and_speculation_equals_plain(name, graphs):
    """bf16 on a GPU, short passes replayed as CUDA graphs (the window in their bias) or eager."""
    hf = hf_model(FAMILIES[name])
    cfg = ModelConfig.from_hf(FAMILIES[name])
    sd = {k: v for k, v in hf.state_dict().items() if not (cfg.tie_word_embeddings and k == "lm_head.weight")}
    model = Transformer.from_state_dict(cfg, sd, torch.bfloat16, "cuda", 64)
    draft = Transformer.from_state_dict(cfg, draft_weights(sd, 0.03, 1), torch.bfloat16, "cuda", 64)
    if not graphs:
        model.graphs = draft.graphs = None
    for n in (2, 5, 16):
        together, steps = pass_and_steps(model, ids(20, seed=2), ids(n, seed=3))
        assert together.device.type == "cuda" and torch.equal(together, steps), n
    engine = Engine(model, tiny_tokenizer(), draft, cache=CacheConfig(block_size=8, max_seq_len=64), eos_ids=set())
    greedy = SamplingParams(max_new_tokens=30)
    *_, plain = engine.generate(ids(6, seed=4), greedy, SpecParams(enabled=False))
    engine.reset()
    *_, spec = engine.generate(ids(6, seed=4), greedy, SpecParams(k=4, drafter="model"))
    assert spec.token_ids == plain.token_ids
