"""The inspector's rows (engine.spec.inspection) against the dense computation they stand for: TV as
1 - sum(min(p, q)) and the residual as norm(max(0, p - q)) over the whole vocabulary, with q a point mass (greedy
drafting, the n-gram lookup: read off p at the drafted token) and with q a full distribution."""
from __future__ import annotations

import pytest
import torch

from engine.spec.inspection import inspect_round
from engine.spec.sampling import point_mass, residual

VOCAB = 3000


def _rows(seed: int, k: int, point: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(torch.randn(k + 1, VOCAB, generator=g) * 3, -1)  # (K+1, V)
    if point:
        drafted = torch.multinomial(p[:k], 1, generator=g)[:, 0]  # drafts the target may well reject
        return p, point_mass(drafted, VOCAB), drafted
    q = torch.softmax(torch.randn(k, VOCAB, generator=g) * 3, -1)  # (K, V)
    return p, q, torch.multinomial(q, 1, generator=g)[:, 0]


@pytest.mark.parametrize("point", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_tv_and_residual_match_the_dense_computation(point, seed):
    k = 4
    p, q, drafted = _rows(seed, k, point)
    rejected = seed % k
    correction = int(residual(p[rejected], q[rejected]).argmax())
    rows = inspect_round(p, q, drafted, [0.5] * k, rejected, correction, str)
    assert len(rows) == k + 1
    for i in range(k):
        tv = 1.0 - torch.minimum(p[i], q[i]).sum().item()
        assert rows[i].tv == pytest.approx(tv, abs=1e-6)
        assert rows[i].p_of(int(drafted[i])) == pytest.approx(float(p[i, drafted[i]]), abs=1e-7)
    r = residual(p[rejected], q[rejected])
    row = rows[rejected]
    assert list(row.residual_ids[:10]) == torch.topk(r, 10).indices.tolist()
    assert row.residual == pytest.approx(r[torch.tensor(row.residual_ids)].tolist(), rel=1e-5, abs=1e-9)
    assert correction in row.residual_ids
    if point:  # q(t) = 1 leaves t no residual mass
        assert int(drafted[rejected]) not in row.residual_ids
    assert all(not rows[i].residual for i in range(k + 1) if i != rejected)


def test_greedy_rows_read_the_logits_and_their_point_masses():
    """Greedy: p and q are point masses (TV 0 where the argmaxes agree, 1 where not; the residual is the
    target's token alone), and the rows show softmax(logits) at each row's top tokens, largest first."""
    g = torch.Generator().manual_seed(7)
    k = 3
    logits = torch.randn(k + 1, VOCAB, generator=g) * 4  # (K+1, V)
    draft_logits = logits[:k] + torch.randn(k, VOCAB, generator=g) * 2  # (K, V) a draft that mostly agrees
    p = point_mass(logits.argmax(-1), VOCAB)
    drafted = draft_logits.argmax(-1)
    drafted[1] = int(logits[1].argmax()) + 1  # row 1 is rejected
    drafted[0] = int(logits[0].argmax())  # row 0 passes
    q = point_mass(drafted, VOCAB)
    token = int(logits[1].argmax())
    rows = inspect_round(p, q, drafted, [0.5] * k, 1, token, str, logits=logits, draft_logits=draft_logits)
    assert rows[0].tv == 0.0 and rows[1].tv == 1.0
    assert rows[1].residual_ids[:1] == (token,) and rows[1].residual[:1] == (1.0,)
    assert sum(rows[1].residual) == pytest.approx(1.0)
    shown = torch.softmax(logits, -1)
    for i, row in enumerate(rows):
        assert row.from_logits
        assert list(row.ids[:10]) == torch.topk(logits[i], 10).indices.tolist()
        assert row.p == pytest.approx(shown[i, torch.tensor(row.ids)].tolist(), rel=1e-5, abs=1e-9)
