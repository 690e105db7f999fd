"""The K tuner's arithmetic (engine/analysis/sweep.py) and its CSV (engine/analysis/stats.py)."""
import csv

import pytest

from engine.analysis.stats import SessionStats, tuner_path
from engine.analysis.sweep import KS, SWEEP_COLUMNS, Sweep, SweepRun, plan, run_of
from engine.analysis.theory import theoretical_speedup
from engine.api.events import Origin
from tests.app_fixtures import make_round, make_summary


def run(drafter, k, new=40, rounds=20, drafted=0, accepted=0, trials=0, decode_s=4.0, draft_ms=0.0, verify_ms=3000.0):
    return SweepRun(drafter, k, new, rounds, drafted, accepted, trials, decode_s, draft_ms, verify_ms, "length")


def test_plan():
    assert plan(True) == [(None, 0)] + [("model", k) for k in KS] + [("ngram", k) for k in KS]
    assert plan(False, (1, 2)) == [(None, 0), ("ngram", 1), ("ngram", 2)]
    with pytest.raises(ValueError, match=">= 1"):
        plan(True, (0, 1))


def test_sweep_run_checks_itself():
    with pytest.raises(ValueError, match="drafter"):
        run("lookup", 2)
    with pytest.raises(ValueError, match="K must be 0"):
        run(None, 2)
    with pytest.raises(ValueError, match="K must be 0"):
        run("model", 0)
    with pytest.raises(ValueError, match="inconsistent"):
        run("model", 2, drafted=3, accepted=4, trials=5)
    with pytest.raises(ValueError, match="one plain run"):
        Sweep((run(None, 0), run(None, 0)))


def test_run_of_counts_decided_tests_and_leaves_out_the_prompts_reading_only():
    """The prompt prefill and the draft model's first catch-up (its reading of the prompt) are left out of the
    decode time; a later catch-up is paid while decoding and counts, as in the chat's own rate."""
    from dataclasses import replace

    from engine.runtime.tally import RoundTally

    rounds = [replace(make_round(1, accepted=("a", "b"), rejected=("c", "d")), draft_prefill_ms=400.0),  # 3 tests
              replace(make_round(2, accepted=("e", "f"), origin=Origin.BONUS), draft_prefill_ms=300.0)]  # 2 tests
    tally = RoundTally(prompt_tokens=30, prefill_s=0.5)
    for i, ev in enumerate(rounds):
        tally.add(ev, 0.6 + i)
    s = tally.summary(total_s=2.0, stop_reason="length")
    r = run_of("model", 4, s, rounds, message=7)
    assert (r.drafted, r.accepted, r.trials, r.message) == (6, 4, 5, 7)
    assert r.decode_s == pytest.approx(2.0 - 0.5 - 0.4)  # the 0.3 s catch-up of round 2 stays in
    assert r.tokens_per_s == pytest.approx(s.new_tokens / 1.1)


def test_one_rate_definition_in_the_summary_and_the_tuner():
    """The reply's rate (the chat footer, the session CSV) kept the draft's prefill in while the
    K tuner's (its dialog, NAME_tuner.csv) left it out; a replay then showed two rates."""
    from dataclasses import replace

    from engine.runtime.tally import RoundTally

    rounds = [replace(make_round(1, accepted=("a", "b"), rejected=("c",)), draft_prefill_ms=400.0),
              make_round(2, accepted=("e",), origin=Origin.BONUS)]
    tally = RoundTally(prompt_tokens=30, prefill_s=0.5)
    for i, ev in enumerate(rounds):
        tally.add(ev, 0.6 + i)
    s = tally.summary(total_s=2.0, stop_reason="length")
    assert s.tokens_per_s == pytest.approx(s.new_tokens / (2.0 - 0.5 - 0.4))
    assert run_of("model", 3, s, rounds).tokens_per_s == pytest.approx(s.tokens_per_s)


def test_speedup_alpha_c_leviathan_and_best():
    plain = run(None, 0, new=40, decode_s=4.0, verify_ms=4000.0)  # 10 tok/s, 100 ms a target step
    m1 = run("model", 1, new=40, drafted=20, accepted=15, trials=20, decode_s=2.5, draft_ms=200.0)  # 16 tok/s
    m2 = run("model", 2, new=40, drafted=30, accepted=21, trials=28, decode_s=2.0, draft_ms=300.0)  # 20 tok/s
    n3 = run("ngram", 3, new=40, drafted=12, accepted=6, trials=10, decode_s=3.2)  # 12.5 tok/s
    sweep = Sweep((plain, m1, m2, n3))
    assert sweep.speedup(m1) == pytest.approx(1.6) and sweep.speedup(n3) == pytest.approx(1.25)
    assert sweep.alpha == pytest.approx(36 / 48)  # the model runs only
    assert sweep.c == pytest.approx((500 / 50) / 100)
    assert sweep.leviathan(3) == pytest.approx(theoretical_speedup(0.75, 3, 0.1))
    assert sweep.best is m2
    assert sweep.noise is None  # every speculative replay accepted something
    idle = run("ngram", 5, new=40, drafted=2, accepted=0, trials=2, decode_s=3.6)  # nothing accepted: ~plain, 1.11x
    assert Sweep((plain, m1, idle)).noise == pytest.approx(4.0 / 3.6 - 1.0)
    rows = sweep.rows(2)
    assert [r["drafter"] for r in rows] == ["plain", "model", "model", "ngram"]
    assert [r["best"] for r in rows] == [0, 0, 1, 0] and rows[0]["sweep"] == 2
    assert rows[3]["leviathan_speedup"] == "" and rows[1]["leviathan_speedup"] == round(sweep.leviathan(1), 4)
    assert set(rows[0]) == set(SWEEP_COLUMNS)


def test_no_plain_run_no_speedup():
    sweep = Sweep((run("model", 1, drafted=5, accepted=5, trials=5),))
    assert sweep.speedup(sweep.runs[0]) is None and sweep.best is None and sweep.c is None


def test_csv_export_writes_the_sweeps(tmp_path):
    stats = SessionStats()
    path = tmp_path / "s.csv"
    stats.write_csv(path)
    assert not tuner_path(path).exists()  # no sweep, no file
    stats.sweeps.append(Sweep((run(None, 0), run("model", 2, drafted=4, accepted=3, trials=4, decode_s=2.0))))
    stats.sweeps.append(Sweep((run(None, 0), run("ngram", 1, drafted=1, accepted=1, trials=1))))
    main, side = stats.write_csv(path)
    assert tuner_path(path) == tmp_path / "s_tuner.csv"
    with tuner_path(path).open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert tuple(rows[0]) == SWEEP_COLUMNS
    assert [(r["sweep"], r["drafter"], r["k"], r["best"]) for r in rows] == [
        ("1", "plain", "0", "0"), ("1", "model", "2", "1"), ("2", "plain", "0", "0"), ("2", "ngram", "1", "1")]
    assert rows[1]["speedup"] == "2.0"
