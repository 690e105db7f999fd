"""A draft LM head that scores part of the vocabulary: which rows, and that it stays lossless end to end."""
from __future__ import annotations

import numpy as np
import pytest

from engine.api.config import CacheConfig, SamplingParams, SpecParams
from engine.spec.draft_vocab import head_rows
from engine.io.loading import load_engine

try:
    from test_weights import make_hf_model, make_tokenizer, write_gguf
except ImportError:  # tests/ imported as a package
    from tests.test_weights import make_hf_model, make_tokenizer, write_gguf


def test_rows_are_the_first_ids_plus_every_special_token():
    types = [1] * 10 + [3, 1, 4]  # 10 normal, a control token, a normal one, a user-defined one
    rows = head_rows({"tokenizer.ggml.token_type": types}, 13, keep=4)
    assert rows.tolist() == [0, 1, 2, 3, 10, 12]
    assert head_rows({}, 13, keep=13) is None and head_rows({}, 13, keep=None) is None
    with pytest.raises(ValueError, match="at least one"):
        head_rows({}, 13, keep=0)


def test_greedy_speculative_equals_plain_with_a_trimmed_draft_head(tmp_path):
    tok = make_tokenizer()
    target = write_gguf(tmp_path / "t.gguf", make_hf_model("qwen2", len(tok)), tok, "Q8_0")
    draft = write_gguf(tmp_path / "d.gguf", make_hf_model("qwen2", len(tok), num_hidden_layers=1), tok, "Q8_0")
    keep = len(tok) // 2
    engine = load_engine(str(target), str(draft), device="cpu", cache=CacheConfig(max_seq_len=128), draft_vocab=keep)
    ids = engine.draft.head_ids.numpy()
    assert engine.draft.lm_head.out_features == len(ids) < len(tok) and np.all(ids[:keep] == np.arange(keep))
    assert engine.target.head_ids is None  # the target always scores everything
    engine.eos_ids = set()  # random weights: run to the length limit
    greedy = SamplingParams(max_new_tokens=40)
    for prompt in ([5, 17, 99, 3], [42, 42, 7, 42, 42, 7, 42]):
        engine.reset()
        *_, plain = engine.generate(prompt, greedy, SpecParams(enabled=False))
        for k in (1, 4):
            engine.reset()
            *events, spec = engine.generate(prompt, greedy, SpecParams(k=k, drafter="model"))
            assert spec.token_ids == plain.token_ids, k
            assert all(d.token_id in set(ids.tolist()) for e in events for d in e.drafted)
