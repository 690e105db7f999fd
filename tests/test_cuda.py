"""The engine on a GPU (CUDA, bf16): exactness where the matmul library chooses its own kernels. CI has no GPU,
so these run where one is lent (README, Tests) and are reported as skipped everywhere else."""
from __future__ import annotations

import pytest
import torch

from engine.api.config import SamplingParams, SpecParams
from engine.io.loading import load_engine
from engine.model.transformer import Transformer
from tests.test_exactness import PROMPTS, assert_exact_distribution, run
from tests.tiny import (ENGINE_CFG, QWEN2_TINY, draft_weights, hf_model, model_config, pass_and_steps, save_folder,
                        state_dict, tiny_tokenizer)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# The embedded draft's widths (Qwen2.5-0.5B) over fewer layers: the matmul shapes the library really sees.
WIDE = dict(QWEN2_TINY, hidden_size=896, intermediate_size=4864, num_hidden_layers=4, num_attention_heads=14,
            num_key_value_heads=2, vocab_size=32768)


def test_short_passes_score_each_row_exactly_as_a_step():
    model = Transformer.from_state_dict(model_config(WIDE), state_dict(hf_model(WIDE, 7)), torch.bfloat16, "cuda",
                                        512)
    prompt = list(range(100, 140))
    for n in (2, 5, 9, 16):
        together, steps = pass_and_steps(model, prompt, list(range(1000 + n, 1000 + 2 * n)))
        assert together.device.type == "cuda" and together.shape == (n, WIDE["vocab_size"])
        assert torch.equal(together, steps), n


@pytest.fixture(scope="module")
def gpu_engine(tmp_path_factory):
    root = tmp_path_factory.mktemp("pair")
    target = hf_model(ENGINE_CFG, 0)
    draft = hf_model(ENGINE_CFG, 0)
    draft.load_state_dict(draft_weights(dict(target.state_dict()), 0.03, 1))
    tok = tiny_tokenizer()
    engine = load_engine(str(save_folder(target, tok, root / "t")), str(save_folder(draft, tok, root / "d")),
                         device="cuda")
    assert engine.device.type == "cuda" and engine.dtype == torch.bfloat16
    return engine


@pytest.mark.parametrize("drafter", ["model", "ngram", "hybrid"])
@pytest.mark.parametrize("k", [1, 3, 8, 16])
def test_greedy_speculative_equals_plain_on_the_gpu(gpu_engine, drafter, k):
    greedy = SamplingParams(temperature=0.0, max_new_tokens=40)
    accepted = 0
    for messages in PROMPTS:
        prompt = gpu_engine.encode_chat(messages)
        gpu_engine.reset()
        plain = run(gpu_engine, prompt, greedy, SpecParams(enabled=False))
        gpu_engine.reset()
        spec = run(gpu_engine, prompt, greedy, SpecParams(k=k, drafter=drafter))
        assert spec.token_ids == plain.token_ids, messages
        accepted += spec.accepted
    assert accepted > 0


def test_sampling_distribution_is_exact_on_the_gpu():
    cfg_dict = dict(ENGINE_CFG, num_hidden_layers=1)
    sd = state_dict(hf_model(cfg_dict, 3))
    cfg = model_config(cfg_dict)
    target = Transformer.from_state_dict(cfg, sd, torch.bfloat16, "cuda", 256)
    draft = Transformer.from_state_dict(cfg, draft_weights(sd, 0.05, 4), torch.bfloat16, "cuda", 256)
    assert_exact_distribution(target, draft, tiny_tokenizer(), "model", 1.0, 0.9, draws=6000)


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_a_gguf_pair_is_dequantized_onto_the_gpu_and_stays_exact(tmp_path, drafter):
    from engine.api.config import CacheConfig
    from tests.test_weights import make_hf_model, make_tokenizer, write_gguf

    tok = make_tokenizer()
    target = write_gguf(tmp_path / "t.gguf", make_hf_model("qwen2", len(tok)), tok, "Q8_0")
    draft = write_gguf(tmp_path / "d.gguf", make_hf_model("qwen2", len(tok), num_hidden_layers=1), tok, "Q8_0")
    engine = load_engine(str(target), str(draft), device="cuda", cache=CacheConfig(max_seq_len=128))
    assert engine.device.type == "cuda" and engine.target_pool.k.dtype == torch.bfloat16
    engine.eos_ids = set()  # random weights: run to the length limit
    greedy = SamplingParams(max_new_tokens=40)
    for prompt in ([5, 17, 99, 3], [42, 42, 7, 42, 42, 7, 42]):
        engine.reset()
        *_, plain = engine.generate(prompt, greedy, SpecParams(enabled=False))
        for k in (1, 4, 16):
            engine.reset()
            *_, spec = engine.generate(prompt, greedy, SpecParams(k=k, drafter=drafter))
            assert spec.token_ids == plain.token_ids, (drafter, k)
