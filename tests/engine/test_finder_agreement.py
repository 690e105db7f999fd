"""scripts/bench/finder_agreement.py's verdict: whether speclens-bench's figures keep the finder's top two in order."""
import pytest

from scripts.bench.finder_agreement import Ranked, verdict

FINDER = [Ranked("qwen 0.5b", 1.40, 4), Ranked("n-gram", 1.10, 3)]


def test_bench_keeping_the_order_agrees():
    v = verdict(FINDER, [Ranked("n-gram", 1.05, 3), Ranked("qwen 0.5b", 1.30, 4)])
    assert v.agree is True
    assert v.sentence.startswith("agree") and "qwen 0.5b ahead of n-gram" in v.sentence


def test_bench_swapping_the_order_disagrees():
    v = verdict(FINDER, [Ranked("qwen 0.5b", 1.00, 4), Ranked("n-gram", 1.25, 3)])
    assert v.agree is False
    assert "n-gram ahead of qwen 0.5b, by 25.0%" in v.sentence


def test_bench_figures_within_the_tie_decide_nothing():
    v = verdict(FINDER, [Ranked("qwen 0.5b", 1.20, 4), Ranked("n-gram", 1.19, 3)], tie=0.03)
    assert v.agree is None and v.sentence.startswith("too close to call")
    # the same figures with no tie allowed: the bench's order decides
    assert verdict(FINDER, [Ranked("qwen 0.5b", 1.20, 4), Ranked("n-gram", 1.19, 3)], tie=0.0).agree is True


def test_nothing_decoded_is_no_verdict():
    assert verdict(FINDER, [Ranked("qwen 0.5b", 0.0, 4), Ranked("n-gram", 1.1, 3)]).agree is None


@pytest.mark.parametrize("finder, bench_side, tie", [
    (FINDER[:1], FINDER, 0.03),  # one candidate is no ranking
    (FINDER, [Ranked("qwen 0.5b", 1.3, 4), Ranked("gemma", 1.1, 3)], 0.03),  # not the same two
    (FINDER, FINDER, 1.5),  # a tie of more than the whole figure
])
def test_refused_inputs(finder, bench_side, tie):
    with pytest.raises(ValueError):
        verdict(finder, bench_side, tie)
