"""A tokenizer from a GGUF file's own metadata, built with the `tokenizers` library.

transformers can convert GGUF tokenizers too, but it takes tens of seconds for a 150k-token vocabulary; this
builds the same byte-level BPE in well under a second for the pre-tokenizers we know (tests check both agree
token for token), wrapped in engine.io.chat_tokenizer rather than transformers. Anything else falls back to
transformers' converter.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.api.errors import ModelLoadError
from engine.io.chat_tokenizer import ChatTokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

# GGUF tokenizer.ggml.pre -> (split regex, BPE ignore_merges). No Unicode normalizer: neither llama.cpp nor
# transformers' GGUF converter applies one, and the same file must give the same tokens everywhere.
_CONTRACTIONS = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|"
_TAIL = r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
PRE_TOKENIZERS: dict[str, tuple[str, bool]] = {
    "qwen2": (_CONTRACTIONS + r"\p{N}" + _TAIL, False),  # Qwen2 / Qwen2.5
    "llama-bpe": (_CONTRACTIONS + r"\p{N}{1,3}" + _TAIL, True),  # Llama 3.x
}
NORMAL, UNKNOWN, CONTROL, USER_DEFINED = 1, 2, 3, 4  # tokenizer.ggml.token_type values
# End-of-generation tokens llama.cpp finds by their text and makes control tokens whatever the file says (its
# llama-vocab.cpp): text spelling one is then that one token, never its characters
EOG_TEXTS = frozenset({"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
                       "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
                       "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>"})
# A base model's file has no chat template: a conversation is then completed as plain text after BOS (its messages'
# text run together), which is what such a model was trained on; GGUFFile.completes_text tells the load info.
PLAIN_COMPLETION = "{{ bos_token or '' }}{% for m in messages %}{{ m['content'] }}{% endfor %}"


def tokenizer_from_gguf(path: Path, metadata: dict[str, Any]) -> ChatTokenizer | PreTrainedTokenizerBase:
    """The tokenizer (with chat template and special tokens) that the GGUF describes."""
    model, pre = metadata.get("tokenizer.ggml.model"), metadata.get("tokenizer.ggml.pre")
    if model == "gpt2" and pre in PRE_TOKENIZERS:
        return _byte_level_bpe(metadata, *PRE_TOKENIZERS[pre])
    if model == "llama" and metadata.get("tokenizer.ggml.scores") is not None:
        return _sentencepiece_bpe(metadata)
    log.info("%s: tokenizer %s/%s is built by transformers' GGUF converter (slow)", path.name, model, pre)
    return _via_transformers(path, metadata)


def _byte_level_bpe(meta: dict[str, Any], pattern: str, ignore_merges: bool) -> ChatTokenizer:
    from tokenizers import (
        AddedToken,
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
    )

    tokens: list[str] = meta["tokenizer.ggml.tokens"]
    types = _types(meta, tokens)
    merges = [tuple(m.split(" ", 1)) for m in meta.get("tokenizer.ggml.merges", [])]
    bpe = models.BPE({t: i for i, t in enumerate(tokens)}, merges, ignore_merges=ignore_merges)
    tk = Tokenizer(bpe)
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tk.decoder = decoders.ByteLevel()
    tk.add_tokens([AddedToken(t, special=ty == CONTROL, normalized=False)
                   for t, ty in zip(tokens, types) if ty in (CONTROL, USER_DEFINED)])

    def token(key: str) -> str | None:
        i = meta.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    bos = token("bos")
    if meta.get("tokenizer.ggml.add_bos_token") and bos is not None:
        tk.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                          special_tokens=[(bos, tokens.index(bos))])
    return ChatTokenizer(tk, bos_token=bos, eos_token=token("eos"), pad_token=token("padding"),
                         unk_token=token("unknown"), chat_template=_template(meta))


def _sentencepiece_bpe(meta: dict[str, Any]) -> ChatTokenizer:
    """llama.cpp's SentencePiece tokenizer (Gemma, Llama 2, Phi-3): spaces spelled "▁", then adjacent pieces
    merged while their concatenation is a token, the highest-scored first, and a character no token spells as its
    UTF-8 bytes (<0xNN>). That is a BPE whose merges are every split of every token into two tokens, ranked by the
    whole token's score; built here in a second or two for Gemma's 262k tokens, where transformers' converter takes
    about a minute."""
    from tokenizers import (
        AddedToken,
        Tokenizer,
        decoders,
        models,
        normalizers,
        processors,
    )

    tokens: list[str] = list(meta["tokenizer.ggml.tokens"])
    scores: list[float] = meta["tokenizer.ggml.scores"]
    types = _types(meta, tokens)
    if len(scores) != len(tokens) or len(types) != len(tokens):
        raise ModelLoadError("GGUF tokenizer metadata: tokens, scores and token types differ in length")
    # Gemma stores its runs of spaces as spaces; as pieces they are spelled with "▁", like every other space
    pieces = [t.replace(" ", "\u2581") if ty == NORMAL else t for t, ty in zip(tokens, types)]
    vocab: dict[str, int] = {}
    for i, t in enumerate(pieces):
        vocab.setdefault(t, i)
    ranked = []
    for i, t in enumerate(pieces):
        if types[i] != NORMAL or vocab[t] != i:
            continue
        for k in range(1, len(t)):
            a, b = t[:k], t[k:]
            if a in vocab and b in vocab:
                ranked.append((-scores[i], i, k, a, b))
    ranked.sort()
    merges = [(a, b) for *_, a, b in ranked]
    unk = next((t for t, ty in zip(pieces, types) if ty == UNKNOWN), None)
    tk = Tokenizer(models.BPE(vocab, merges, unk_token=unk, byte_fallback=True, fuse_unk=True))
    space = [normalizers.Prepend("\u2581")] if meta.get("tokenizer.ggml.add_space_prefix", True) else []
    tk.normalizer = normalizers.Sequence([*space, normalizers.Replace(" ", "\u2581")])
    tk.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                    *([decoders.Strip(" ", 1, 0)] if space else [])])
    tk.add_tokens([AddedToken(t, special=ty == CONTROL, normalized=False)
                   for t, ty in zip(tokens, types) if ty in (CONTROL, USER_DEFINED)])

    def token(key: str) -> str | None:
        i = meta.get(f"tokenizer.ggml.{key}_token_id")
        return tokens[i] if isinstance(i, int) and 0 <= i < len(tokens) else None

    bos = token("bos")
    if meta.get("tokenizer.ggml.add_bos_token", True) and bos is not None:
        tk.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                          special_tokens=[(bos, tokens.index(bos))])
    return ChatTokenizer(tk, bos_token=bos, eos_token=token("eos"), pad_token=token("padding"),
                         unk_token=token("unknown"), chat_template=_template(meta))


def _types(meta: dict[str, Any], tokens: list[str]) -> list[int]:
    """tokenizer.ggml.token_type, with llama.cpp's end-of-generation tokens made control tokens."""
    types = list(meta.get("tokenizer.ggml.token_type") or [NORMAL] * len(tokens))
    return [CONTROL if ty == NORMAL and t in EOG_TEXTS else ty for t, ty in zip(tokens, types)]


def _template(meta: dict[str, Any]) -> str:
    template = meta.get("tokenizer.chat_template")
    return template if isinstance(template, str) and template else PLAIN_COMPLETION


def _via_transformers(path: Path, meta: dict[str, Any]) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as e:  # transformers raises many kinds
        raise ModelLoadError(f"{path}: cannot build a tokenizer from the GGUF metadata: {e}") from e
    if tok.chat_template is None and meta.get("tokenizer.chat_template"):
        tok.chat_template = meta["tokenizer.chat_template"]
    return tok
