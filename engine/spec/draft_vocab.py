"""Which rows of the vocabulary a draft model's LM head scores.

A draft's LM head is a large part of its step: for the embedded 0.5B draft, 145 MB of the 391 MB it streams
per token (151,936 x 896, Q8_0). A draft that scores only the common part of the vocabulary proposes
from that part alone (q = 0 elsewhere), which speculative sampling allows: the output stays exactly the
target's for any q, and only acceptance can drop, when the target's next token lies outside the part.

BPE vocabularies number their tokens in merge order, roughly by frequency, so the part is the first
`keep` ids plus every special token. On the embedded pair's benchmark replies, 1.4% of the (non-special)
tokens lie beyond id 65,536 (3.3% beyond 32,768), while keeping 65,536 rows cuts the draft's head by 57%.
"""
from __future__ import annotations

from typing import Any

import numpy as np

DRAFT_VOCAB = 65536  # rows a draft's head keeps by default (plus special tokens); None keeps all
SPECIAL_TYPES = (3, 4)  # tokenizer.ggml.token_type: CONTROL, USER_DEFINED


def head_rows(metadata: dict[str, Any], vocab_size: int, keep: int | None = DRAFT_VOCAB) -> np.ndarray | None:
    """Sorted token ids the head scores, or None for the whole vocabulary (nothing to gain)."""
    if keep is None or keep >= vocab_size:
        return None
    if keep < 1:
        raise ValueError(f"a draft head must keep at least one token, not {keep}")
    types = np.asarray(metadata.get("tokenizer.ggml.token_type") or [], dtype=np.int64)[:vocab_size]
    special = np.flatnonzero(np.isin(types, SPECIAL_TYPES))
    return np.union1d(np.arange(keep), special).astype(np.int64)
