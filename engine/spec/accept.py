"""The accept/reject rule of speculative sampling, as a pure function of p, q and the drafted tokens.

For each drafted token t_i: accept with probability min(1, p_i(t_i) / q_i(t_i)); at the first
rejection draw the replacement from norm(max(0, p_i - q_i)) and stop; if all K pass, draw a bonus
token from p_{K+1}. The committed tokens are then distributed exactly as the target's own samples
(Leviathan et al., 2023, Theorem 1).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.spec.sampling import residual, sample


@dataclass(frozen=True)
class Verdict:
    accepted: int  # n: drafts kept, 0..K
    next_token: int  # the correction (n < K) or the bonus token (n == K)
    p_drafted: tuple[float, ...]  # p_i(t_i) for each drafted token
    q_drafted: tuple[float, ...]  # q_i(t_i) for each drafted token
    p_next: float  # probability of next_token under the distribution it was drawn from
    u: tuple[float, ...] = ()  # the uniform draw that tested each drafted token (for the inspector)

    @property
    def bonus(self) -> bool:
        return self.accepted == len(self.p_drafted)


def accept_reject(
    drafted: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None
) -> Verdict:
    """drafted (K,), q (K, V), p (K+1, V) -> Verdict. One host sync for the K acceptance tests."""
    k = len(drafted)
    rows = torch.arange(k, device=p.device)
    p_t = p[rows, drafted]  # (K,)
    q_t = q[rows, drafted]  # (K,)
    u = torch.rand(k, generator=generator, device=p.device)  # (K,)
    passed = (u * q_t < p_t).tolist()  # u < p/q without dividing by q
    n = passed.index(False) if False in passed else k
    if n < k:
        dist = residual(p[n], q[n])
        nxt = sample(dist, generator)
        p_next = float(p[n, nxt])
    else:
        nxt = sample(p[k], generator)
        p_next = float(p[k, nxt])
    return Verdict(n, nxt, tuple(p_t.tolist()), tuple(q_t.tolist()), p_next, tuple(u.tolist()))
