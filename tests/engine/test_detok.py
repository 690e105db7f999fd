"""Incremental detokenization never splits a multi-byte character and loses or invents nothing."""
from __future__ import annotations

import pytest

from engine.runtime.detok import Detokenizer
from tests.tiny import tiny_tokenizer

CORPUS = [
    "héllo wörld 日本語 🙂",
    "naïve café über straße façade",
    "日本語のテキストです。東京 😀🙂👍",
    "hello world, hello there, hello again",
    "Ελληνικά и русский текст",
] * 4

TEXTS = [
    "héllo wörld 日本語 🙂",
    "naïve café 😀👍 straße",
    "日本語のテキスト",
    "🙂🙂🙂 emoji only 👍",
    "family 👨‍👩‍👧 and flags 🇯🇵",  # ZWJ sequence and regional indicators: several code points each
    "combining e\u0301 and ñ",
    "mixed: Ελληνικά, русский, 中文, עברית",
    "plain ascii, nothing special",
    "€100 ≈ ¥15000 → ✓",
]


def byte_level_bpe():
    """GPT-2-style byte-level BPE with a vocabulary small enough that many characters span several tokens."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=290, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<eos>"],
    )
    tok.train_from_iterator(CORPUS, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")


def byte_fallback_bpe():
    """Llama-2-style: '▁' word marks, <0xXX> byte tokens for anything not in the vocabulary."""
    from tokenizers import Tokenizer, decoders, models, normalizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    for b in range(256):
        vocab[f"<0x{b:02X}>"] = len(vocab)
    for c in "▁" + "".join(chr(i) for i in range(33, 127)):
        vocab.setdefault(c, len(vocab))
    merges = [("▁", "h"), ("e", "l"), ("▁h", "el"), ("l", "o"), ("▁", "w")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, unk_token="<unk>", fuse_unk=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")


@pytest.fixture(scope="module", params=["byte_level", "byte_fallback"])
def tokenizer(request):
    return byte_level_bpe() if request.param == "byte_level" else byte_fallback_bpe()


def stream(tokenizer, ids: list[int], **kw) -> list[str]:
    d = Detokenizer(tokenizer, **kw)
    return [d.push(t) for t in ids]


def decode(tokenizer, ids, skip=True) -> str:
    return tokenizer.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=False)


def test_the_tokenizers_really_split_characters(tokenizer):
    """Guard: the test is only meaningful if single tokens decode to partial characters."""
    partial = 0
    for text in TEXTS:
        ids = tokenizer.encode(text, add_special_tokens=False)
        assert decode(tokenizer, ids) == text  # round-trips
        partial += sum("\ufffd" in decode(tokenizer, [i]) for i in ids)
    assert partial > 20


@pytest.mark.parametrize("text", TEXTS)
def test_no_split_characters_and_nothing_lost(tokenizer, text):
    ids = tokenizer.encode(text, add_special_tokens=False)
    deltas = stream(tokenizer, ids)
    assert not any("\ufffd" in d for d in deltas), deltas
    assert "".join(deltas) == decode(tokenizer, ids) == text
    emitted = ""
    for d in deltas:  # text only ever grows at the end: never retracted or rewritten
        emitted += d
        assert text.startswith(emitted)
    if any(ord(c) > 127 for c in text):
        assert "" in deltas  # something was held back to wait for the rest of a character


def test_every_prefix_of_a_long_stream(tokenizer):
    """Stopping anywhere: what was emitted is a prefix of the text, and all of it at character boundaries."""
    text = " ".join(TEXTS)
    ids = tokenizer.encode(text, add_special_tokens=False)
    d = Detokenizer(tokenizer)
    emitted = ""
    for n, t in enumerate(ids, 1):
        emitted += d.push(t)
        full = decode(tokenizer, ids[:n])
        assert "\ufffd" not in emitted
        assert text.startswith(emitted)
        if "\ufffd" not in full:  # at a character boundary everything so far is out
            assert emitted == full
    assert emitted == text


def test_special_tokens_are_skipped_or_kept(tokenizer):
    text = "日本語 🙂 ok"
    ids = tokenizer.encode(text, add_special_tokens=False)
    eos = tokenizer.eos_token_id
    mixed = ids[:2] + [eos] + ids[2:5] + [eos] + ids[5:]
    deltas = stream(tokenizer, mixed)
    assert "".join(deltas) == text
    assert not any("\ufffd" in d for d in deltas)
    kept = "".join(stream(tokenizer, mixed, skip_special_tokens=False))
    assert kept == decode(tokenizer, mixed, skip=False)
    assert tokenizer.eos_token in kept


def test_char_level_tokenizer_one_char_per_token():
    tok = tiny_tokenizer()
    text = "Hello, world! (a + b) * 2"
    ids = tok.encode(text)
    deltas = stream(tok, ids)
    assert deltas == list(text)
