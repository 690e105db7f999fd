"""scripts/profile/ab_builds.py: how it splits its rounds into the host's memory moods."""
from scripts.profile.ab_builds import moods


def test_two_moods_part_at_their_gap():
    bws = [30, 31, 33, 60, 62, 35, 61, 59, 34, 33]
    assert moods(bws) == ["slow", "slow", "slow", "fast", "fast", "slow", "fast", "fast", "slow", "slow"]


def test_a_lone_outlier_is_no_mood():
    assert set(moods([22.0] + [33.0] * 59)) == {"all"}


def test_steady_bandwidth_is_one_mood():
    assert set(moods([35.0, 36.0, 34.5, 35.5, 36.2, 34.9, 35.1])) == {"all"}
