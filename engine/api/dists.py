"""What the distribution inspector shows for one position of a round: bounded top-k views of p and q.

Pure data, no torch: the GUI process unpickles these from the engine process and reads them from traces.
A position is a row of the verify pass: drafted token i and the token committed at index i (an accepted
draft, or the correction after the rejected draft i) share row i; the bonus (or plain) token is the last row.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

TOP_K = 10  # tokens kept per distribution and position: bounds each round's event size


@dataclass(frozen=True)
class PositionDist:
    """One row's distributions, kept to the tokens that matter.

    `ids` are the top tokens by p, then the draft's top tokens not among them; `p` and `q` give both
    distributions' probability of each (exact values, not only the ones each model ranked). Under greedy
    decoding p and q are point masses; then `from_logits` is set and `p`/`q` are softmax(logits) at T = 1
    (the raw logits, before any repetition penalty) so the reader sees what the argmax chose among.
    `tv` and `residual` always describe the point masses / transformed distributions actually used."""

    ids: tuple[int, ...]
    texts: tuple[str, ...]
    p: tuple[float, ...]  # target
    q: tuple[float, ...] | None = None  # draft; None where nothing was drafted (bonus or plain row)
    u: float | None = None  # the uniform draw that tested this row's drafted token
    tv: float | None = None  # total-variation distance between p and q; 1 - tv = sum(min(p, q))
    residual_ids: tuple[int, ...] = ()  # norm(max(0, p - q)) top tokens, for the row of a rejection
    residual_texts: tuple[str, ...] = ()
    residual: tuple[float, ...] = ()
    from_logits: bool = False  # greedy: p and q above are softmax(logits) at T = 1, not the point masses

    def __post_init__(self) -> None:
        n = len(self.ids)
        if len(self.texts) != n or len(self.p) != n or (self.q is not None and len(self.q) != n):
            raise ValueError(f"PositionDist: ids, texts, p and q must have one entry per token ({n})")
        if not len(self.residual_ids) == len(self.residual_texts) == len(self.residual):
            raise ValueError("PositionDist: residual_ids, residual_texts and residual must have the same length")
        for name in ("u", "tv"):
            v = getattr(self, name)
            if v is not None and not (math.isfinite(v) and -1e-6 <= v <= 1.0 + 1e-6):
                raise ValueError(f"PositionDist.{name} must be in [0, 1], got {v}")

    @property
    def overlap(self) -> float | None:
        """sum(min(p, q)) = 1 - TV: the chance a draft sampled from q passes at this row."""
        return None if self.tv is None else 1.0 - self.tv

    def p_of(self, token: int) -> float | None:
        return self.p[self.ids.index(token)] if token in self.ids else None

    def q_of(self, token: int) -> float | None:
        return self.q[self.ids.index(token)] if self.q is not None and token in self.ids else None
