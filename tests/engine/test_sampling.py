"""The sampling transforms and the accept/reject rule as pure functions, on hand-made distributions."""
from __future__ import annotations

import pytest
import torch

from engine.api.config import SamplingParams
from engine.spec.accept import accept_reject
from engine.spec.sampling import (
    greedy_token,
    point_mass,
    probs_for_positions,
    probs_from_logits,
    repetition_penalty,
    residual,
    sample,
    top_ids,
    top_k_filter,
    top_p_filter,
)

EMPTY = torch.empty(0, dtype=torch.long)


def gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --- the inspector's top ids ---


@pytest.mark.parametrize("vocab", [151_665, 4096, 5000, 40])
def test_top_ids_are_torch_topk_s_ids(vocab):
    """Distinct values: the same ids in the same order, whole blocks only or with a tail, or too few blocks."""
    rows = torch.randn(5, vocab, generator=gen(vocab)) * 3
    assert torch.equal(top_ids(rows, 10, width=512), torch.topk(rows, 10, dim=-1).indices)
    view = rows[1:4, 3:]  # rows that are a view into a larger tensor
    assert torch.equal(top_ids(view, 10, width=512), torch.topk(view, 10, dim=-1).indices)


def test_top_ids_of_rows_with_ties_hold_the_k_largest_values():
    """A sparse distribution (top-k filtered) or a trimmed head's -inf: the values are those of torch's topk."""
    probs = torch.zeros(3, 8192)
    probs[0, [7, 4000, 8191]] = torch.tensor([0.5, 0.3, 0.2])
    probs[1, 100:120] = 0.05
    probs[2] = float("-inf")
    probs[2, 5000:5003] = torch.tensor([1.0, 3.0, 2.0])
    ids = top_ids(probs, 10, width=512)
    assert torch.equal(probs.gather(1, ids), torch.topk(probs, 10, dim=-1).values)
    assert ids[0, :3].tolist() == [7, 4000, 8191] and ids[2, :3].tolist() == [5001, 5002, 5000]


# --- transforms --------------------------------------------------------------------------------------


def test_greedy_is_a_point_mass_at_the_argmax():
    logits = torch.tensor([0.1, 2.0, -1.0, 1.9, 0.0])
    p = probs_from_logits(logits, SamplingParams(temperature=0.0), EMPTY)
    assert p.tolist() == [0.0, 1.0, 0.0, 0.0, 0.0]
    # top-k / top-p do not move it
    p = probs_from_logits(logits, SamplingParams(temperature=0.0, top_k=2, top_p=0.3), EMPTY)
    assert p.tolist() == [0.0, 1.0, 0.0, 0.0, 0.0]
    assert sample(p, gen(0)) == 1


def test_greedy_rows_for_several_positions():
    logits = torch.tensor([[0.0, 1.0, 2.0], [5.0, 1.0, 2.0]])
    p = probs_for_positions(logits, SamplingParams(), EMPTY, torch.tensor([2]))
    assert p.tolist() == [[0.0, 0.0, 1.0], [1.0, 0.0, 0.0]]


@pytest.mark.parametrize("t", [0.5, 1.0, 2.0])
def test_temperature_scales_logits_before_softmax(t):
    logits = torch.tensor([1.0, 2.0, 0.5, -1.0])
    p = probs_from_logits(logits, SamplingParams(temperature=t), EMPTY)
    torch.testing.assert_close(p, torch.softmax(logits / t, -1))
    assert abs(float(p.sum()) - 1.0) < 1e-6


def test_lower_temperature_is_sharper():
    logits = torch.tensor([1.0, 2.0, 0.5, -1.0])
    peaks = [float(probs_from_logits(logits, SamplingParams(temperature=t), EMPTY).max()) for t in (2.0, 1.0, 0.3)]
    assert peaks[0] < peaks[1] < peaks[2]


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_top_k_keeps_exactly_k(k):
    logits = torch.tensor([0.3, -1.0, 2.5, 0.9, 1.7, -0.2, 0.0])
    kept = top_k_filter(logits, k)
    finite = torch.isfinite(kept)
    assert int(finite.sum()) == k
    expected = set(torch.topk(logits, k).indices.tolist())
    assert set(finite.nonzero().flatten().tolist()) == expected
    assert torch.equal(kept[finite], logits[finite])  # survivors untouched
    p = probs_from_logits(logits, SamplingParams(temperature=1.0, top_k=k), EMPTY)
    assert int((p > 0).sum()) == k
    torch.testing.assert_close(p[finite], torch.softmax(logits[finite], -1))


@pytest.mark.parametrize("k", [0, 7, 100])
def test_top_k_off(k):
    logits = torch.tensor([0.3, -1.0, 2.5, 0.9, 1.7, -0.2, 0.0])
    assert torch.equal(top_k_filter(logits, k), logits)


def test_top_p_keeps_smallest_prefix_reaching_the_mass_and_renormalises():
    # Exactly representable numbers, in scrambled order: sorted they are 0.5, 0.25, 0.125, 0.0625, 0.0625.
    probs = torch.tensor([0.0625, 0.25, 0.5, 0.0625, 0.125])
    # 0.5 alone does not reach 0.7; 0.5 + 0.25 = 0.75 does: keep those two.
    out = top_p_filter(probs, 0.7)
    assert out.tolist() == pytest.approx([0.0, 1 / 3, 2 / 3, 0.0, 0.0])
    # Mass exactly 0.75 is reached by the same two (no third token needed).
    assert top_p_filter(probs, 0.75).tolist() == pytest.approx([0.0, 1 / 3, 2 / 3, 0.0, 0.0])
    # Just above: the 0.125 joins.
    assert top_p_filter(probs, 0.76).tolist() == pytest.approx([0.0, 0.25 / 0.875, 0.5 / 0.875, 0.0, 0.125 / 0.875])
    # The top token alone when it already reaches the mass.
    assert top_p_filter(probs, 0.5).tolist() == pytest.approx([0.0, 0.0, 1.0, 0.0, 0.0])
    assert top_p_filter(probs, 0.01).tolist() == pytest.approx([0.0, 0.0, 1.0, 0.0, 0.0])
    # Off.
    assert torch.equal(top_p_filter(probs, 1.0), probs)


def full_sort_top_p(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """top-p as its definition reads: sort the whole row, keep while the mass strictly ahead is below top_p."""
    sp, order = torch.sort(probs, dim=-1, descending=True, stable=True)
    sp = sp.masked_fill(sp.cumsum(-1) - sp >= top_p, 0.0)
    kept = torch.zeros_like(probs).scatter(-1, order, sp)
    return kept / kept.sum(-1, keepdim=True)


@pytest.mark.parametrize("spread", [8.0, 3.0, 0.3])  # peaked (found above the first floor), flatter, nearly flat
def test_top_p_over_candidates_keeps_what_a_full_sort_keeps(spread):
    # 151,936 tokens, as the embedded pair's rows: the filter looks only above a floor when that holds the mass;
    # a flat row must fall through to the whole row. Several rows at once, as a verify pass gives them.
    g = torch.Generator().manual_seed(7)
    probs = torch.softmax(torch.randn(3, 151_936, generator=g) * spread, -1)
    probs[1, :1000] = 0.0  # zeros inside a row
    probs[1] /= probs[1].sum()
    for top_p in (0.5, 0.9, 0.999):
        out, ref = top_p_filter(probs, top_p), full_sort_top_p(probs, top_p)
        assert torch.equal(out > 0, ref > 0), top_p
        assert torch.allclose(out, ref, rtol=1e-5, atol=1e-9)
        assert torch.allclose(out.sum(-1), torch.ones(3))


def test_top_p_through_probs_from_logits():
    probs = torch.tensor([0.5, 0.25, 0.125, 0.125])
    p = probs_from_logits(probs.log(), SamplingParams(temperature=1.0, top_p=0.7), EMPTY)
    torch.testing.assert_close(p, torch.tensor([2 / 3, 1 / 3, 0.0, 0.0]))


def test_repetition_penalty_direction():
    logits = torch.tensor([2.0, -2.0, 1.0, -1.0, 0.5])
    context = torch.tensor([0, 1, 1])  # token 1 appears twice: penalised once
    out = repetition_penalty(logits, context, 2.0)
    assert out.tolist() == [1.0, -4.0, 1.0, -1.0, 0.5]  # positive shrinks, negative grows more negative
    assert logits.tolist() == [2.0, -2.0, 1.0, -1.0, 0.5]  # not modified in place
    assert torch.equal(repetition_penalty(logits, context, 1.0), logits)
    assert torch.equal(repetition_penalty(logits, EMPTY, 2.0), logits)
    # Both directions lower the seen tokens' probabilities.
    params = SamplingParams(temperature=1.0, repetition_penalty=2.0)
    p0 = probs_from_logits(logits, SamplingParams(temperature=1.0), EMPTY)
    p1 = probs_from_logits(logits, params, context)
    assert p1[0] < p0[0] and p1[1] < p0[1]
    assert all(p1[i] > p0[i] for i in (2, 3, 4))


def test_repetition_penalty_can_change_the_greedy_choice():
    logits = torch.tensor([3.0, 2.0, 0.0])
    assert probs_from_logits(logits, SamplingParams(repetition_penalty=2.0), torch.tensor([0])).argmax() == 1
    assert probs_from_logits(logits, SamplingParams(repetition_penalty=2.0), torch.tensor([2])).argmax() == 0


def test_probs_for_positions_uses_drafted_tokens_as_context():
    # Row i sees context + drafted[:i]: with a penalty, row 1 penalises drafted[0].
    logits = torch.tensor([[3.0, 2.9, 0.0], [3.0, 2.9, 0.0], [3.0, 2.9, 0.0]])
    params = SamplingParams(repetition_penalty=1.5)
    p = probs_for_positions(logits, params, torch.tensor([2]), torch.tensor([0, 1]))
    assert p.argmax(-1).tolist() == [0, 1, 0]  # row 2 sees 0 and 1 both penalised: 2.0 vs 1.93
    for i in range(3):
        ctx = torch.cat([torch.tensor([2]), torch.tensor([0, 1])[:i]])
        assert torch.equal(p[i], probs_from_logits(logits[i], params, ctx))


def test_residual_is_normalised_positive_part():
    p = torch.tensor([0.5, 0.3, 0.2, 0.0])
    q = torch.tensor([0.1, 0.5, 0.1, 0.3])
    r = residual(p, q)
    torch.testing.assert_close(r, torch.tensor([0.4, 0.0, 0.1, 0.0]) / 0.5)
    # p == q: nothing to correct towards; falls back to p instead of dividing by zero
    assert torch.equal(residual(p, p), p)


def test_point_mass():
    q = point_mass(torch.tensor([2, 0, 2]), 4)
    assert q.tolist() == [[0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 1, 0]]
    assert point_mass(torch.empty(0, dtype=torch.long), 4).shape == (0, 4)


# --- accept / reject ---------------------------------------------------------------------------------


def test_equal_distributions_always_accept():
    p1 = torch.tensor([0.1, 0.2, 0.3, 0.4])
    p = torch.stack([p1, p1, p1, p1])  # K=3, plus the bonus row
    g = gen(0)
    for _ in range(200):
        drafted = torch.multinomial(p1, 3, replacement=True, generator=g)
        v = accept_reject(drafted, p[:3], p, g)
        assert v.accepted == 3 and v.bonus
        assert v.p_drafted == pytest.approx(tuple(p1[drafted].tolist()))
        assert v.q_drafted == v.p_drafted
        assert v.p_next == pytest.approx(float(p1[v.next_token]))


def test_draft_token_with_zero_target_mass_is_always_rejected_and_corrected_from_residual():
    p_row = torch.tensor([0.6, 0.4, 0.0, 0.0])
    q_row = torch.tensor([0.2, 0.2, 0.6, 0.0])
    p = torch.stack([p_row, p_row])
    q = q_row[None]
    drafted = torch.tensor([2])
    g = gen(1)
    counts = torch.zeros(4)
    n = 3000
    for _ in range(n):
        v = accept_reject(drafted, q, p, g)
        assert v.accepted == 0 and not v.bonus
        assert v.p_drafted == (0.0,)
        counts[v.next_token] += 1
    # residual = norm(max(0, p - q)) = norm([0.4, 0.2, 0, 0]) = [2/3, 1/3, 0, 0]
    assert counts[2] == 0 and counts[3] == 0
    assert abs(counts[0] / n - 2 / 3) < 0.03


def test_greedy_point_masses_reduce_to_exact_match():
    p = torch.tensor([[0.0, 1.0, 0.0], [0.0, 0.0, 1.0], [1.0, 0.0, 0.0]])
    q = point_mass(torch.tensor([1, 0]), 3)
    v = accept_reject(torch.tensor([1, 0]), q, p, gen(0))
    assert (v.accepted, v.next_token) == (1, 2)  # first matches, second rejected, target's argmax replaces it
    q = point_mass(torch.tensor([1, 2]), 3)
    v = accept_reject(torch.tensor([1, 2]), q, p, gen(0))
    assert (v.accepted, v.next_token, v.bonus) == (2, 0, True)


def test_stops_at_the_first_rejection():
    # Position 0 always rejected; positions 1 and 2 would always pass but must not count.
    good = torch.tensor([0.5, 0.5, 0.0])
    p = torch.stack([torch.tensor([1.0, 0.0, 0.0]), good, good, good])
    q = torch.stack([torch.tensor([0.0, 1.0, 0.0]), good, good])
    for seed in range(20):
        v = accept_reject(torch.tensor([1, 0, 1]), q, p, gen(seed))
        assert v.accepted == 0 and v.next_token == 0


def test_acceptance_frequency_matches_overlap_mass():
    p_row = torch.tensor([0.4, 0.3, 0.2, 0.1, 0.0])
    q_row = torch.tensor([0.1, 0.1, 0.3, 0.2, 0.3])
    overlap = float(torch.minimum(p_row, q_row).sum())  # 0.1 + 0.1 + 0.2 + 0.1 + 0 = 0.5
    assert overlap == pytest.approx(0.5)
    p = torch.stack([p_row, p_row])
    q = q_row[None]
    g = gen(1234)
    n = 6000
    accepted = 0
    per_token_acc = torch.zeros(5)
    per_token_n = torch.zeros(5)
    committed = torch.zeros(5)
    for _ in range(n):
        t = torch.multinomial(q_row, 1, generator=g)
        v = accept_reject(t, q, p, g)
        accepted += v.accepted
        per_token_n[t] += 1
        per_token_acc[t] += v.accepted
        committed[t if v.accepted else v.next_token] += 1
    sigma = (overlap * (1 - overlap) / n) ** 0.5
    assert abs(accepted / n - overlap) < 4 * sigma
    # Per drafted token: accepted with probability min(1, p/q).
    expect = torch.where(q_row > 0, torch.clamp(p_row / q_row, max=1.0), torch.zeros(5))
    seen = per_token_acc / per_token_n.clamp_min(1)
    assert torch.allclose(seen, expect, atol=0.05), (seen, expect)
    # And the committed token is distributed as p (Leviathan et al., Theorem 1).
    assert torch.allclose(committed / n, p_row, atol=0.025), committed / n


def test_argmax_is_torch_argmax_first_of_ties_included():
    from engine.spec.sampling import argmax

    x = torch.randn(6, 300)
    x[1, 7] = x[1, 200] = x[1].max() + 1  # a tie: the first one wins, as in torch
    x[2, :] = float("-inf")
    x[3, 50:] = float("-inf")  # a trimmed head
    assert torch.equal(argmax(x), x.argmax(-1))
    assert int(argmax(x[1])) == 7 and argmax(x[1]).dim() == 0


def test_logsumexp_matches_torch_on_rows_with_minus_infinity():
    from engine.spec.sampling import logsumexp

    x = torch.randn(4, 151936) * 4
    x[1, 65600:] = float("-inf")
    torch.testing.assert_close(logsumexp(x), torch.logsumexp(x, -1, keepdim=True), rtol=4e-6, atol=1e-5)  # fp32
    torch.testing.assert_close(logsumexp(x[1]), torch.logsumexp(x[1], -1, keepdim=True), rtol=4e-6, atol=1e-5)


@pytest.mark.parametrize("penalty", [1.0, 3.0])
def test_greedy_token_is_where_the_transform_puts_its_point_mass(penalty):
    params = SamplingParams(temperature=0.0, repetition_penalty=penalty)
    g = torch.Generator().manual_seed(5)
    for _ in range(20):
        logits = torch.randn(50, generator=g)
        context = torch.topk(logits, 3).indices  # the top tokens seen: a penalty can move the argmax
        probs = probs_from_logits(logits, params, context)
        assert probs[greedy_token(logits, params, context)] == 1.0
