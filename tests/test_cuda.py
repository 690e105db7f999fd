"""The engine on a GPU (CUDA, bf16): exactness where the matmul library chooses its own kernels. CI has no GPU,
so these run where one is lent (README, Tests) and are reported as skipped everywhere else."""
from __future__ import annotations

import pytest
import torch

from engine.io.loading import load_engine
from engine.model.transformer import Transformer
from tests.test_exactness import assert_exact_distribution, greedy_identity
from tests.tiny import (ENGINE_CFG, QWEN2_TINY, draft_weights, hf_model, model_config, pair_folders, pass_and_steps,
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
    engine = load_engine(*map(str, pair_folders(tmp_path_factory.mktemp("pair"))), device="cuda")
    assert engine.device.type == "cuda" and engine.dtype == torch.bfloat16
    return engine


@pytest.mark.parametrize("drafter", ["model", "ngram", "hybrid"])
@pytest.mark.parametrize("k", [1, 3, 8, 16])
def test_greedy_speculative_equals_plain_on_the_gpu(gpu_engine, drafter, k):
    _, accepted, _, _ = greedy_identity(gpu_engine, drafter, k)
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
    from tests.test_gguf_model import assert_greedy_identity, gguf_pair_engine
    from tests.test_weights import make_tokenizer

    engine = gguf_pair_engine(make_tokenizer(), tmp_path, "cuda")
    assert engine.device.type == "cuda" and engine.target_pool.k.dtype == torch.bfloat16
    assert_greedy_identity(engine, drafter, (1, 4, 16))
