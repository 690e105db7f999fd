"""Llama-3.2-1B's exact config (llama3 rope scaling, tied embeddings, GQA 32/8, head_dim 64), shrunk only
in depth, MLP width and vocabulary, loaded from an HF folder and checked against transformers."""
import json

import torch

from engine.api.config import ModelConfig
from engine.io.weights import load_checkpoint
from engine.model.kv_cache import BlockManager, KVPool
from engine.model.transformer import Transformer
from tests.tiny import hf_model, save_folder, tiny_tokenizer

LLAMA_32_1B = {  # config.json of meta-llama/Llama-3.2-1B-Instruct
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 128000, "eos_token_id": [128001, 128008, 128009], "head_dim": 64, "hidden_act": "silu",
    "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 8192, "max_position_embeddings": 131072,
    "mlp_bias": False, "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 16,
    "num_key_value_heads": 8, "pretraining_tp": 1, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 32.0, "high_freq_factor": 4.0, "low_freq_factor": 1.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": True, "use_cache": True, "vocab_size": 128256,
}
SHRUNK = dict(LLAMA_32_1B, num_hidden_layers=2, intermediate_size=256, vocab_size=512,
              bos_token_id=1, eos_token_id=[2])


def test_config_fields_are_read_exactly():
    c = ModelConfig.from_hf(LLAMA_32_1B)
    assert (c.num_heads, c.num_kv_heads, c.head_dim, c.hidden_size, c.num_layers) == (32, 8, 64, 2048, 16)
    assert c.tie_word_embeddings and c.rope_scaling["rope_type"] == "llama3" and c.rope_theta == 500000.0
    assert c.eos_token_ids == (128001, 128008, 128009) and not c.attention_bias


def test_llama32_shaped_model_matches_transformers(tmp_path):
    hf = hf_model(SHRUNK, seed=5)
    with torch.no_grad():  # width-aware scale: at hidden 2048 the tiny-model init saturates attention
        for name, p in hf.named_parameters():
            if p.ndim == 2:
                p.normal_(0.0, 1.0 if "embed" in name else 1.5 / p.shape[1] ** 0.5)
    folder = save_folder(hf, tiny_tokenizer(), tmp_path / "llama32")
    saved = json.loads((folder / "config.json").read_text())  # transformers 5 writes "rope_parameters"
    assert (saved.get("rope_scaling") or saved.get("rope_parameters"))["rope_type"] == "llama3"
    ck = load_checkpoint(folder)
    model = Transformer.from_state_dict(ck.config, ck.tensors, torch.float32, "cpu", max_len=2048)
    cfg = ck.config
    pool = KVPool(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, BlockManager(64, 16, 1024), torch.float32, "cpu")
    pool.manager.allocate(0)
    # Far enough into the sequence that the rescaled low frequencies matter.
    ids = torch.randint(0, 512, (700,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
    start, end = pool.manager.append(0, 699)
    got = [model(ids[:699], start, pool.view(0, start, end))]
    start, end = pool.manager.append(0, 1)
    got.append(model(ids[699:], start, pool.view(0, start, end)))
    torch.testing.assert_close(torch.cat(got), ref, atol=2e-4, rtol=2e-4)
