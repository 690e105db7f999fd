"""scripts/bench/policy_replay.py: the modes' rounds over a recorded reply, priced by the recorded costs."""
import pytest

from engine.spec import policy
from scripts.bench.policy_replay import Costs, Mode, replay_reply

COSTS = {"verify_ms": {"1": 40.0, "2": 50.0, "3": 60.0, "4": 70.0, "5": 80.0},
         "draft_ms": {"1": 10.0, "2": 20.0, "3": 30.0, "4": 40.0},
         "first_pass_ms": {"0": 8.0, "1": 10.0, "15": 40.0, "63": 200.0}, "round_other_ms": 2.0}
REPLY = list(range(1000, 1041))  # 41 tokens, no repeats: the n-gram lookup never matches


def recorded(right: bool) -> dict:
    """The draft model's 4-token drafts at every position: the reply's own next tokens (all pass) or wrong ones."""
    drafts = [((REPLY[i : i + 4] if right else [7, 8, 9, 10][: len(REPLY[i : i + 4])]), [0.99] * 4)
              for i in range(len(REPLY))]
    return {"prompt": [1, 2, 3], "reply": REPLY, "drafts": drafts}


def costs() -> Costs:
    return Costs.of({"costs": COSTS}, 0.0, 0)


def test_plain_is_one_step_a_token_and_the_first_round_is_left_out():
    tokens, seconds, rounds = replay_reply(Mode("plain", "plain", 0), recorded(True), 128, costs(), policy.PolicyState())
    assert (tokens, rounds) == (40, 41)
    assert seconds == pytest.approx(40 * 0.042)


def test_a_draft_that_always_passes_commits_k_plus_one_a_round():
    tokens, seconds, rounds = replay_reply(Mode("draft K4", "draft", 4), recorded(True), 128, costs(),
                                           policy.PolicyState())
    assert rounds == 9 and tokens == 41 - 5  # 8 rounds of 5, then the last token (room for one draft)
    # rounds 2-8: 4 drafted with the cache a token behind after a bonus, and a 5-row verify; round 9: 1 and 2 rows
    per_round = 0.040 + (0.010 - 0.008) + 0.080 + 0.002
    assert seconds == pytest.approx(7 * per_round + (0.010 + 0.002) + 0.050 + 0.002)


def test_the_hybrid_follows_what_pays():
    """Over a reply the draft model always gets right the hybrid drafts with it, about as fast as the draft model
    alone; over one it always gets wrong it mostly decodes plainly, far above the draft model alone (its first
    tries and re-tries cost a 41-token reply ~20%)."""
    good = replay_reply(Mode("hybrid K4", "hybrid", 4), recorded(True), 128, costs(), policy.PolicyState())
    bad = replay_reply(Mode("hybrid K4", "hybrid", 4), recorded(False), 128, costs(), policy.PolicyState())
    plain = replay_reply(Mode("plain", "plain", 0), recorded(True), 128, costs(), policy.PolicyState())
    wrong = replay_reply(Mode("draft K4", "draft", 4), recorded(False), 128, costs(), policy.PolicyState())
    rate = lambda r: r[0] / r[1]  # noqa: E731
    right = replay_reply(Mode("draft K4", "draft", 4), recorded(True), 128, costs(), policy.PolicyState())
    assert rate(good) > 1.5 * rate(plain) and rate(good) > 0.95 * rate(right)
    assert rate(bad) > 0.75 * rate(plain) and rate(bad) > 2.0 * rate(wrong)
