"""The distribution inspector's data for one round, from the tensors verification already holds.

Bounded and cheap: one top-k over the target's rows, one over the draft's, a gather of each distribution at the
other's top tokens (so the paired bars are exact), the TV distances, and the residual of a rejection; then one
transfer to the host for all of it. The sampling path never sees any of this: nothing here draws a random number.

It runs every round, on the engine's thread between the verify and the next draft, and each pass over a
151,936-token row costs ~0.1 ms on a 2-core CPU: so a row's maximum is read off its top-k instead of found again,
and where q is a point mass (greedy drafting, the n-gram lookup) the overlap and the residual are read off p at the
drafted token instead of from V-wide passes over p and q.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from engine.api.dists import TOP_K, PositionDist
from engine.spec.sampling import logsumexp, residual, top_ids


def inspect_round(
    p: torch.Tensor, q: torch.Tensor | None, drafted: torch.Tensor, u: Sequence[float], row: int, token: int,
    piece: Callable[[int], str], *, logits: torch.Tensor | None = None, draft_logits: torch.Tensor | None = None,
    top_k: int = TOP_K,
) -> tuple[PositionDist, ...]:
    """p (N, V): the target's rows as sampled from (N = K + 1, or 1 for a plain step); q (K, V) the draft's, None
    for a plain step; drafted (K,) and u the K uniform draws; `token` the correction, bonus or plain token and
    `row` its row (a row < K is a rejection); piece: token id -> text. Under greedy, `logits` (N, V) and
    `draft_logits` (K, V; None for a model-free drafter) are shown instead of the point masses.
    -> one PositionDist per row; each row names its drafted and committed tokens even outside the top k."""
    n_rows, vocab = p.shape
    k_drafted = 0 if q is None else len(q)
    k = min(top_k, vocab)
    greedy = logits is not None
    shown_p = _Shown(logits, k) if greedy else _Shown(p, k, probs=True)
    top_p = shown_p.top  # (N, k)
    # Each row's own tokens: the drafted one (the committed one on the last row), then the committed one.
    own = torch.full((n_rows, 2), token, dtype=torch.long, device=p.device)
    own[:k_drafted, 0] = drafted.to(p.device)
    parts: list[torch.Tensor] = []
    point_q = False
    if k_drafted:
        shown_q = _Shown(draft_logits, k) if greedy and draft_logits is not None else _Shown(q, k, probs=True)
        d = own[:k_drafted, :1]  # (K, 1)
        # q(t) = 1 leaves no mass elsewhere: sum(min(p, q)) = min(p(t), 1) = p(t), without reading p or q again
        point_q = bool((q.gather(1, d) == 1.0).all())
        overlap = p[:k_drafted].gather(1, d)[:, 0] if point_q else torch.minimum(p[:k_drafted], q).sum(-1)  # (K,)
        ids = torch.cat([top_p[:k_drafted], shown_q.top, own[:k_drafted]], dim=1)
        parts += [ids, shown_p.at(ids, 0), shown_q.at(ids, 0), 1.0 - overlap]  # TV = 1 - sum(min(p, q))
    last = torch.cat([top_p[k_drafted:], own[k_drafted:]], dim=1)  # the bonus (or plain) row: p only
    parts += [last, shown_p.at(last, k_drafted)]
    rejected = row if row < k_drafted else None
    if rejected is not None:
        parts += _residual_top(p[rejected], q[rejected], int(drafted[rejected]), own[rejected, 1:], k, point_q)
    flat = torch.cat([t.reshape(-1).double() for t in parts]).tolist()  # the one host transfer (ids < 2^53)
    take = _Reader(flat)

    out: list[PositionDist] = []
    width = 2 * k + 2
    if k_drafted:
        ids_rows, p_rows, q_rows, tvs = (take.rows(k_drafted, width), take.rows(k_drafted, width),
                                         take.rows(k_drafted, width), take.items(k_drafted))
    last_ids, last_p = take.rows(n_rows - k_drafted, k + 2), take.rows(n_rows - k_drafted, k + 2)
    res_ids, res_p = (take.items(k + 1), take.items(k + 1)) if rejected is not None else ([], [])
    for i in range(k_drafted):
        keep = _distinct(ids_rows[i], p_rows[i], q_rows[i], q_from=k, q_to=2 * k)
        res = _kept(res_ids, res_p) if i == rejected else []
        out.append(PositionDist(
            ids=tuple(t for t, _, _ in keep), texts=tuple(piece(t) for t, _, _ in keep),
            p=tuple(a for _, a, _ in keep), q=tuple(b for _, _, b in keep), u=float(u[i]),
            tv=min(max(tvs[i], 0.0), 1.0), residual_ids=tuple(t for t, _ in res),
            residual_texts=tuple(piece(t) for t, _ in res), residual=tuple(v for _, v in res), from_logits=greedy,
        ))
    for ids_, ps in zip(last_ids, last_p):
        keep = _kept(ids_, ps)
        out.append(PositionDist(ids=tuple(t for t, _ in keep), texts=tuple(piece(t) for t, _ in keep),
                                p=tuple(v for _, v in keep), from_logits=greedy))
    return tuple(out)


def _residual_top(p: torch.Tensor, q: torch.Tensor, drafted: int, committed: torch.Tensor, k: int,
                  point_q: bool) -> list[torch.Tensor]:
    """[ids, values] of a rejection's residual norm(max(0, p - q)) (V,): its k largest, then the committed token.
    For q a point mass at the drafted token t the residual is p without t, renormalized: p's k + 1 largest less t,
    over 1 - p(t) (below 1: p(t) = 1 would have accepted t)."""
    if point_q and k < len(p):
        top = top_ids(p.unsqueeze(0), k + 1)[0]
        ids = torch.cat([top[top != drafted][:k], committed])  # the committed token is never t: t was rejected
        return [ids, p[ids] / (1.0 - p[drafted])]
    r = residual(p, q)
    ids = torch.cat([top_ids(r.unsqueeze(0), k)[0], committed])
    return [ids, r[ids]]


class _Shown:
    """Rows to rank and read probabilities from: probabilities as they are, or logits read as softmax at T = 1
    (ranked by the logits themselves, and only the values read are exponentiated: no V-wide softmax). `top`: each
    row's k largest ids, largest first."""

    def __init__(self, rows: torch.Tensor, k: int, probs: bool = False) -> None:
        self.ranked = rows if probs else rows.float()
        self.top = top_ids(self.ranked, k)  # (N, k)
        self.lse = None if probs else logsumexp(self.ranked, at=self.top[:, :1])  # (N, 1)

    def at(self, ids: torch.Tensor, first: int) -> torch.Tensor:
        """Values at ids (n, m) of rows first .. first + n."""
        rows = self.ranked[first : first + len(ids)]
        if self.lse is None:
            return rows.gather(1, ids)
        return torch.exp(rows.gather(1, ids) - self.lse[first : first + len(ids)])


class _Reader:
    """Walks the flat list the host transfer returned."""

    def __init__(self, flat: list[float]) -> None:
        self.flat, self.at = flat, 0

    def items(self, n: int) -> list[float]:
        self.at += n
        return self.flat[self.at - n : self.at]

    def rows(self, n: int, width: int) -> list[list[float]]:
        return [self.items(width) for _ in range(n)]


def _distinct(ids: list[float], ps: list[float], qs: list[float], q_from: int = 0,
              q_to: int = 0) -> list[tuple[int, float, float]]:
    """p's top tokens then q's, each once. Tokens with no mass under either are dropped, and so are q's picks
    [q_from, q_to) that q gives nothing: a point mass's top k is one token and k - 1 arbitrary zeros."""
    seen: set[int] = set()
    out = []
    for j, (t, a, b) in enumerate(zip(ids, ps, qs)):
        t = int(t)
        if t not in seen and (a > 0 or b > 0) and not (q_from <= j < q_to and b <= 0):
            seen.add(t)
            out.append((t, a, b))
    return out


def _kept(ids: list[float], values: list[float]) -> list[tuple[int, float]]:
    return [(t, v) for t, v, _ in _distinct(ids, values, [0.0] * len(values))]
