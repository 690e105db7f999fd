"""The part of the vocabulary a trimmed LM head scores (a draft's, engine.spec.draft_vocab), and the moves between
the head's rows (n of them) and the whole vocabulary (V).

A draft samples in the head's own rows and widens only what leaves it (its q rows, the inspector's logits): every
V-wide pass per draft token (the -inf fill, the sampling transform, the confidence's softmax) cost ~0.2 ms on a
2-core Zen 3, next to a ~11 ms draft step.
"""
from __future__ import annotations

import torch


class HeadPart:
    def __init__(self, ids: torch.Tensor, vocab_size: int) -> None:
        ids = ids.to(torch.long)  # (n,)
        if ids.dim() != 1 or len(ids) == 0:
            raise ValueError("a trimmed head must score at least one token id, given as a 1-d tensor")
        if bool((ids[1:] <= ids[:-1]).any()) or int(ids[0]) < 0 or int(ids[-1]) >= vocab_size:
            raise ValueError(f"a trimmed head's ids must be increasing and inside [0, {vocab_size})")
        self.ids, self.vocab_size = ids, vocab_size
        # ids[:prefix] == 0, 1, ..., prefix - 1 (the common part of a BPE vocabulary): copied as one slice
        self.prefix = int((ids == torch.arange(len(ids))).cumprod(0).sum())
        self.rest = ids[self.prefix :]  # (n - prefix,) the special tokens past it
        self.row_of = torch.full((vocab_size,), -1, dtype=torch.long)  # (V,) an id's row in the head, or -1
        self.row_of[ids] = torch.arange(len(ids))

    def __len__(self) -> int:
        return len(self.ids)

    def rows_below(self, vocab: int) -> int:
        """How many of the head's rows are ids below `vocab` (a tokenizer's vocabulary, often shorter than V)."""
        return int(torch.searchsorted(self.ids, vocab))

    def widen(self, rows: torch.Tensor, fill: float, width: int | None = None) -> torch.Tensor:
        """(..., m) values of the head's first m rows -> (..., width) over the vocabulary, `fill` elsewhere."""
        width = self.vocab_size if width is None else width
        out = rows.new_full((*rows.shape[:-1], width), fill)
        m = rows.shape[-1]
        cut = min(self.prefix, m)
        out[..., :cut] = rows[..., :cut]
        if m > cut:
            out[..., self.rest[: m - cut]] = rows[..., cut:]
        return out

    def rows_of(self, tokens: torch.Tensor) -> torch.Tensor:
        """The head's rows of the given ids, leaving out those it does not score. (m,) -> (m',)"""
        rows = self.row_of[tokens.cpu()].to(tokens.device)
        return rows[rows >= 0]
