"""A draft LM head that scores part of the vocabulary: which rows, and that it stays lossless end to end."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from engine.api.config import CacheConfig, SamplingParams, SpecParams
from engine.io.loading import load_engine
from engine.model.head_part import HeadPart
from engine.spec.draft_vocab import head_rows

try:
    from test_weights import make_hf_model, make_tokenizer, write_gguf
except ImportError:  # tests/ imported as a package
    from tests.engine.test_weights import make_hf_model, make_tokenizer, write_gguf


def test_rows_are_the_first_ids_plus_every_special_token():
    types = [1] * 10 + [3, 1, 4]  # 10 normal, a control token, a normal one, a user-defined one
    rows = head_rows({"tokenizer.ggml.token_type": types}, 13, keep=4)
    assert rows.tolist() == [0, 1, 2, 3, 10, 12]
    assert head_rows({}, 13, keep=13) is None and head_rows({}, 13, keep=None) is None
    with pytest.raises(ValueError, match="at least one"):
        head_rows({}, 13, keep=0)


def test_a_head_part_widens_its_rows_to_the_vocabulary_and_maps_ids_to_rows():
    part = HeadPart(torch.tensor([0, 1, 2, 5, 8]), 10)  # a common prefix 0-2, then two special tokens
    assert part.prefix == 3 and len(part) == 5 and part.rows_below(6) == 4 and part.rows_below(10) == 5
    rows = torch.tensor([[1.0, 2, 3, 4, 5], [6, 7, 8, 9, 10]])
    wide = part.widen(rows, float("-inf"))
    assert wide.shape == (2, 10) and torch.equal(wide[:, part.ids], rows)
    assert wide[:, [3, 4, 6, 7, 9]].isneginf().all()
    assert part.widen(rows[:, :4], 0.0, width=7).tolist()[0] == [1, 2, 3, 0, 0, 4, 0]  # the rows below 7 only
    assert part.rows_of(torch.tensor([8, 4, 2, 5, 9])).tolist() == [4, 2, 3]  # ids 4 and 9 are not scored
    odd = HeadPart(torch.tensor([1, 3]), 4)  # no common prefix
    assert odd.prefix == 0 and odd.widen(torch.tensor([7.0, 9.0]), 0.0).tolist() == [0, 7, 0, 9]


@pytest.mark.parametrize("ids", [[], [2, 1], [1, 1], [-1, 3], [0, 10]])
def test_a_head_part_refuses_ids_that_are_not_increasing_inside_the_vocabulary(ids):
    with pytest.raises(ValueError, match="trimmed head"):
        HeadPart(torch.tensor(ids, dtype=torch.long), 10)


def test_greedy_speculative_equals_plain_with_a_trimmed_draft_head(tmp_path):
    tok = make_tokenizer()
    target = write_gguf(tmp_path / "t.gguf", make_hf_model("qwen2", len(tok)), tok, "Q8_0")
    draft = write_gguf(tmp_path / "d.gguf", make_hf_model("qwen2", len(tok), num_hidden_layers=1), tok, "Q8_0")
    keep = len(tok) // 2
    engine = load_engine(str(target), str(draft), device="cpu", cache=CacheConfig(max_seq_len=128), draft_vocab=keep)
    ids = engine.draft.head.ids.numpy()
    assert engine.draft.lm_head.out_features == len(ids) < len(tok) and np.all(ids[:keep] == np.arange(keep))
    assert engine.target.head is None  # the target always scores everything
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
