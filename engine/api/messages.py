"""What a request's input must be: chat messages and prompt token ids, checked where they enter the engine.

A message is {"role": str, "content": str}. Text must be valid Unicode: a lone surrogate (U+D800..U+DFFF, which
a paste or a bad decode can leave in a Python str) cannot be encoded as UTF-8, so the tokenizer, the CSV export
and the trace file would all fail on it later. The engine refuses it; the app replaces it (`replace_surrogates`).
"""
from __future__ import annotations

import numbers
import re
from collections.abc import Mapping
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")
REPLACEMENT = "\ufffd"


def first_surrogate(text: str) -> int | None:
    """The index of the first code point that cannot be encoded as UTF-8, or None."""
    m = _SURROGATE.search(text)
    return None if m is None else m.start()


def replace_surrogates(text: str) -> str:
    """Each lone surrogate becomes U+FFFD, the character Unicode reserves for text that could not be read."""
    return _SURROGATE.sub(REPLACEMENT, text)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_messages(messages: Any) -> list[dict[str, str]]:
    """The messages as a list of {"role", "content"} dicts; ValueError naming the first field that is wrong."""
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, (list, tuple)):
        raise ValueError(f"messages must be a list of {{'role': ..., 'content': ...}} dicts, got {_short(messages)}")
    if not messages:
        raise ValueError("messages is empty: a request needs at least one message")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ValueError(f"messages[{i}] must be a dict with 'role' and 'content', got {_short(m)}")
        for key in ("role", "content"):
            value = m.get(key)
            if not isinstance(value, str):
                what = "is missing" if key not in m else f"must be a string, got {_short(value)}"
                raise ValueError(f"messages[{i}]['{key}'] {what}")
            at = first_surrogate(value)
            if at is not None:
                raise ValueError(f"messages[{i}]['{key}'] holds a lone surrogate (U+{ord(value[at]):04X}) at character "
                                 f"{at}, which is not valid Unicode text; remove it or replace it with U+FFFD")
        out.append(dict(m))
    return out


def check_prompt_ids(ids: Any) -> list[int]:
    """Token ids as a list of ints; ValueError for anything else (a string, floats, booleans)."""
    if isinstance(ids, (str, bytes, Mapping)) or not isinstance(ids, (list, tuple)):
        raise ValueError(f"prompt_ids must be a list of token ids (integers), got {_short(ids)}")
    for i, t in enumerate(ids):
        if isinstance(t, bool) or not isinstance(t, numbers.Integral):
            raise ValueError(f"prompt_ids[{i}] must be an integer token id, got {_short(t)}")
    return [int(t) for t in ids]
