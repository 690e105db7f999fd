"""Incremental detokenization that never splits a multi-byte character."""
from __future__ import annotations


class Detokenizer:
    """Feed token ids one at a time; get back the text each one adds.

    Decoding a short window (not the whole reply) keeps it O(1) per token; a window whose text ends in
    U+FFFD is an incomplete UTF-8 sequence, so its text is held back until the next token completes it.
    """

    def __init__(self, tokenizer, skip_special_tokens: bool = True) -> None:
        self.tok = tokenizer
        self.skip = skip_special_tokens
        self.ids: list[int] = []
        self.prefix = 0  # window start
        self.read = 0  # ids[:read] have been emitted as text

    def _decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=self.skip, clean_up_tokenization_spaces=False)

    def push(self, token: int) -> str:
        self.ids.append(token)
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            delta = after[len(before) :]
            self.prefix, self.read = self.read, len(self.ids)
            return delta
        return ""

    def flush(self) -> str:
        """At the end of a reply: the text of ids not yet emitted (an unfinished character decodes to U+FFFD)."""
        before = self._decode(self.ids[self.prefix : self.read])
        after = self._decode(self.ids[self.prefix :])
        self.prefix = self.read = len(self.ids)
        return after[len(before) :] if len(after) > len(before) else ""


class TokenTexts:
    """Each token id's text alone, decoded once: the inspector and step-through name ~20 tokens a round."""

    def __init__(self, tokenizer) -> None:
        self.tok = tokenizer
        self._texts: dict[int, str] = {}

    def __call__(self, token: int) -> str:
        text = self._texts.get(token)
        if text is None:
            text = self._texts[token] = self.tok.decode([token], skip_special_tokens=False,
                                                        clean_up_tokenization_spaces=False)
        return text
