"""Our forward matches transformers' own model on the same weights, to fp32 tolerance."""
import pytest
import torch

from engine.model.kv_cache import BlockManager, KVPool
from engine.model.transformer import Transformer
from tests.tiny import LLAMA32_TINY, QWEN2_TINY, hf_model, model_config, state_dict


def ours(cfg_dict, hf):
    cfg = model_config(cfg_dict)
    model = Transformer.from_state_dict(cfg, state_dict(hf), torch.float32, "cpu", max_len=512)
    pool = KVPool(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, BlockManager(40, 8, 320), torch.float32, "cpu")
    pool.manager.allocate(0)
    return model, pool


@pytest.mark.parametrize("cfg", [LLAMA32_TINY, QWEN2_TINY], ids=["llama3.2", "qwen2"])
def test_logits_match_transformers(cfg):
    hf = hf_model(cfg, seed=0)
    model, pool = ours(cfg, hf)
    ids = torch.randint(0, cfg["vocab_size"], (100,), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]  # (T, V)
    # Prefill in two chunks, then decode one token at a time: every path through the cache.
    start, end = pool.manager.append(0, 60)
    a = model(ids[:60], start, pool.view(0, start, end))
    parts = [a]
    for t in range(60, 100):
        start, end = pool.manager.append(0, 1)
        parts.append(model(ids[t : t + 1], start, pool.view(0, start, end)))
    got = torch.cat(parts)
    torch.testing.assert_close(got, ref, atol=1e-4, rtol=1e-4)
    assert ref.abs().max() > 1.0  # the weights are not degenerate: logits spread out


def test_llama3_rope_scaling_is_exercised():
    # Positions past original_max_position_embeddings (64) only match if the llama3 rescaling is right.
    from engine.model.transformer import rope_frequencies

    plain = dict(LLAMA32_TINY, rope_scaling=None)
    assert not torch.allclose(rope_frequencies(model_config(LLAMA32_TINY)), rope_frequencies(model_config(plain)))
