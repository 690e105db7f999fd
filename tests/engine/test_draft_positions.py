"""The draft model's rounds position by position (engine.spec.draft_positions): a round at any ceiling is priced from
rounds drafted at another, exactly where those rounds saw the positions, and a round says nothing past its ceiling."""
from __future__ import annotations

import pytest

from engine.spec.draft_positions import PositionTally, expected_round

ROUNDS = [(4, 4), (4, 1), (2, 2), (1, 0)]  # (drafted, accepted) of four rounds at ceiling 4


def tally(rounds: list[tuple[int, int]], ceiling: int = 4) -> PositionTally:
    t = PositionTally()
    for drafted, accepted in rounds:
        t.add(ceiling, drafted, accepted)
    return t


@pytest.mark.parametrize("ceiling", [1, 2, 3, 4])
def test_a_lower_ceiling_is_priced_as_the_same_rounds_cut_short(ceiling):
    """A draft at ceiling j is the first j tokens of the draft at 4, so with no prior weight the chains give the
    rounds' own means, cut at j: tokens drafted min(d, j), committed min(a, j) + 1."""
    f = expected_round(tally(ROUNDS), PositionTally(), ceiling, 0.5, 0.5, weight=0.0)
    assert f.drafted == pytest.approx(sum(min(d, ceiling) for d, _ in ROUNDS) / len(ROUNDS))
    assert f.committed == pytest.approx(sum(min(a, ceiling) + 1 for _, a in ROUNDS) / len(ROUNDS))


@pytest.mark.parametrize("ceiling", [1, 2, 3, 4])
def test_the_chance_of_each_draft_length_is_the_rounds_own(ceiling):
    """The lengths' chances are what the rounds drafted, cut at the ceiling, and they add up to one: the verify pass
    is priced over them, not at their mean."""
    chances = dict(expected_round(tally(ROUNDS), PositionTally(), ceiling, 0.5, 0.5, weight=0.0).length_chances())
    assert sorted(chances) == list(range(1, ceiling + 1))
    for d, chance in chances.items():
        assert chance == pytest.approx(sum(min(dr, ceiling) == d for dr, _ in ROUNDS) / len(ROUNDS))
    assert sum(chances.values()) == pytest.approx(1.0)


def test_a_round_says_nothing_past_its_ceiling():
    """Rounds at ceiling 2 that passed whole leave positions 3 and 4 to what rounds at 4 measured there, and their
    decay does not touch those counts; a draft that stopped before its ceiling does count as not going on."""
    t = tally([(4, 4)] * 3)
    before = (t.drafted_risk[3], t.passed_went[4])
    for _ in range(5):
        t.add(2, 2, 2, decay=0.5)
    assert (t.drafted_risk[3], t.passed_went[4]) == before
    f = expected_round(t, PositionTally(), 4, 0.5, 0.5, weight=0.0)
    assert (f.committed, f.drafted) == pytest.approx((5.0, 4.0))
    t.add(4, 2, 2)  # stopped at 2 with room for 4: position 3 was not drafted, so not passed either
    assert t.drafted_risk[3] == before[0] + 1 and t.drafted_went[3] == before[0]
    assert t.passed_risk[3] == t.passed_went[3] + 1


def test_with_nothing_measured_the_priors_price_the_round():
    f = expected_round(PositionTally(), PositionTally(), 3, 0.5, 0.8, weight=2.0)
    assert f.drafted == pytest.approx(1 + 0.5 + 0.25)
    assert f.committed == pytest.approx(1 + 0.8 + 0.64 + 0.512)
    assert dict(f.length_chances()) == pytest.approx({1: 0.5, 2: 0.25, 3: 0.25})


def test_this_request_is_shrunk_towards_the_long_run():
    """One round of this request that passed nothing weighs one round against the long run's two pseudo-rounds."""
    long = tally([(1, 1)] * 50, ceiling=1)
    now = tally([(1, 0)], ceiling=1)
    committed = expected_round(now, long, 1, 0.5, 0.5, weight=2.0).committed
    long_rate = (50 + 2 * 0.5) / (50 + 2)
    assert committed == pytest.approx(1 + (0 + 2 * long_rate) / (1 + 2))
