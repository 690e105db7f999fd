"""Tiny random models and a tiny tokenizer, built in-process for fast CPU tests."""
from __future__ import annotations

from pathlib import Path

import torch

from engine.api.config import ModelConfig

# Llama-3.2-style: llama3 rope scaling, tied embeddings, GQA.
LLAMA32_TINY = dict(
    model_type="llama", vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, head_dim=16, rms_norm_eps=1e-5, rope_theta=500000.0,
    rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 64},
    max_position_embeddings=512, tie_word_embeddings=True, bos_token_id=1, eos_token_id=[2],
)
QWEN2_TINY = dict(
    model_type="qwen2", vocab_size=96, hidden_size=64, intermediate_size=112, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1000000.0,
    max_position_embeddings=512, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2,
)


def hf_model(cfg: dict, seed: int):
    """A transformers model with random weights (scaled up so distributions are not flat)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(seed)
    conf = AutoConfig.for_model(**cfg)
    model = AutoModelForCausalLM.from_config(conf, dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" not in name:
                p.normal_(0.0, 0.5 if "embed" in name or "lm_head" in name else 0.3)
    return model


def state_dict(model) -> dict[str, torch.Tensor]:
    sd = dict(model.state_dict())
    if "lm_head.weight" not in sd or model.config.tie_word_embeddings:
        sd.pop("lm_head.weight", None)
    return sd


def model_config(cfg: dict) -> ModelConfig:
    return ModelConfig.from_hf(cfg)


def save_folder(model, tokenizer, path: Path) -> Path:
    model.save_pretrained(path)
    if tokenizer is not None:
        tokenizer.save_pretrained(path)
    return path


CHARS = [chr(c) for c in range(32, 127)]  # 95 printable ASCII characters
VOCAB = 3 + len(CHARS) + 2  # <pad> <s> </s>, the characters, two spare ids
TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}:{{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant:{% endif %}"
)


def tiny_tokenizer():
    """A character-level tokenizer: one token per printable ASCII character."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<s>": 1, "</s>": 2} | {c: 3 + i for i, c in enumerate(CHARS)}
    vocab |= {"<extra0>": VOCAB - 2, "<extra1>": VOCAB - 1}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), "isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
        additional_special_tokens=["<extra0>", "<extra1>"],
    )
    fast.chat_template = TEMPLATE
    return fast


ENGINE_CFG = dict(LLAMA32_TINY, vocab_size=VOCAB)


def draft_weights(target_sd: dict[str, torch.Tensor], noise: float, seed: int) -> dict[str, torch.Tensor]:
    """A draft that agrees with the target often but not always: the target's weights plus noise."""
    g = torch.Generator().manual_seed(seed)
    return {k: v + noise * v.std() * torch.randn(v.shape, generator=g) if v.ndim > 1 else v.clone()
            for k, v in target_sd.items()}


def pair_folders(root: Path) -> tuple[Path, Path]:
    """The tiny pair (ENGINE_CFG and its noisy copy as the draft) saved as two Hugging Face folders under root."""
    target, draft = hf_model(ENGINE_CFG, 0), hf_model(ENGINE_CFG, 0)
    draft.load_state_dict(draft_weights(dict(target.state_dict()), 0.03, 1))
    tok = tiny_tokenizer()
    return save_folder(target, tok, root / "target"), save_folder(draft, tok, root / "draft")


def tiny_engine(max_seq_len: int = 256, draft: bool = True, noise: float = 0.03, **kw):
    from engine.api.config import CacheConfig
    from engine.model.transformer import Transformer
    from engine.runtime.engine import Engine

    cfg = model_config(ENGINE_CFG)
    sd = state_dict(hf_model(ENGINE_CFG, 0))
    target = Transformer.from_state_dict(cfg, sd, torch.float32, "cpu", 512)
    dm = Transformer.from_state_dict(cfg, draft_weights(sd, noise, 1), torch.float32, "cpu", 512) if draft else None
    return Engine(target, tiny_tokenizer(), dm, cache=CacheConfig(block_size=8, max_seq_len=max_seq_len), **kw)


def pass_and_steps(model, prompt: list[int], ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits of ids after prompt, scored in one pass and one token at a time (each from its own cache):
    (T, V) each. A verify pass's rows must equal plain steps' bit for bit for greedy parity."""
    from engine.model.kv_cache import BlockManager, KVPool

    cfg, p = model.cfg, next(model.parameters())

    def fresh():
        pool = KVPool(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, BlockManager(16, 16, 256), p.dtype, p.device)
        pool.manager.allocate(0)
        return pool

    def feed(pool, toks):
        start, end = pool.manager.append(0, len(toks))
        return model(torch.tensor(toks, device=p.device), start, pool.view(0, start, end))  # (T, V)

    pool = fresh()
    feed(pool, prompt)
    together = feed(pool, ids)
    pool = fresh()
    feed(pool, prompt)
    one_by_one = torch.cat([feed(pool, [t]) for t in ids])
    return together, one_by_one
