"""scripts/profile/pass_bound.py: the bound a CPU's integer-dot peak puts on a verify pass, and its micro-benchmark."""
import subprocess

import pytest

from scripts.profile.pass_bound import (
    Peak,
    build_peak,
    compiler,
    parse_peak,
    share_needed,
    steps_bound,
)


def test_the_fastest_dot_is_the_peak():
    out = "clock 3.660\ndot vpdpbusd-256 2 468.2\ndot vpdpbusd-512 2 466.9\n"
    assert parse_peak(out) == Peak("vpdpbusd-256", 468.2, 3.66, 2)
    assert parse_peak(out).per_cycle() == pytest.approx(468.2 / 3.66 / 2)


def test_output_without_a_clock_or_a_dot_is_refused():
    with pytest.raises(ValueError, match="no clock or no dot"):
        parse_peak("dot vpdpbusd-256 2 468.2\n")
    with pytest.raises(ValueError, match="no clock or no dot"):
        parse_peak("clock 3.6\n")


def test_a_pass_bound_by_products_costs_its_products_over_the_step():
    # 1.5 G products a token at 500 G a second: 3 ms a token, so 9 tokens take 27 ms, 1.35 steps of 20 ms
    assert steps_bound(9, 1.5e9, 500.0, 20.0) == pytest.approx(1.35)
    # a pass whose products fit inside one step's weight reading costs at least that step
    assert steps_bound(2, 1.5e9, 500.0, 20.0) == 1.0


def test_the_share_a_goal_needs():
    # 9 tokens in 1.6 steps of 20 ms: 13.5 G products in 32 ms, 422 G a second, 84% of 500
    assert share_needed(9, 1.5e9, 500.0, 20.0, 1.6) == pytest.approx(13.5e9 / 0.032 / 500e9)
    # a faster step leaves the same products less time: the goal needs more of the peak
    assert share_needed(9, 1.5e9, 500.0, 15.0, 1.6) > 1.0


@pytest.mark.skipif(compiler() is None, reason="no C++ compiler here (the kernels' own build needs one too)")
def test_the_micro_benchmark_reports_a_clock_and_a_dot(tmp_path):
    run = subprocess.run([str(build_peak(tmp_path)), "1", "200000"], capture_output=True, text=True)
    if run.returncode == 2:  # a CPU without AVX2: the kernels run their scalar code and there is no dot to time
        assert "no AVX2" in run.stderr
        return
    peak = parse_peak(run.stdout)
    assert peak.threads == 1 and peak.ghz > 0.2 and peak.gps > 0
    # at least one product a cycle: a dot instruction does 32
    assert peak.per_cycle() > 1.0
