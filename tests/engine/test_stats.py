"""engine.analysis.stats: rows, CSV and the speedup arithmetic, on hand-made events (no Qt, no torch in stats)."""
import csv
import dataclasses
import math
import sys

import pytest

from engine.analysis.stats import (
    ROUND_COLUMNS,
    SUMMARY_COLUMNS,
    MessageRecord,
    SessionStats,
    SpeedTotals,
    round_tokens_per_s,
    summary_path,
    summary_row,
)
from engine.analysis.theory import theoretical_speedup
from engine.api.events import Origin
from tests.app_fixtures import make_round, make_summary


def test_stats_imports_neither_qt_nor_torch():
    import subprocess

    code = ("import sys, engine.analysis.stats; bad = [m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'PySide6', 'pyqtgraph')]; print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_theoretical_speedup_formula():
    # alpha = 0: one token per round, paid for with K draft steps.
    assert theoretical_speedup(0.0, 4, 0.1) == pytest.approx(1 / 1.4)
    # alpha = 1: K + 1 tokens per round (the limit of the fraction).
    assert theoretical_speedup(1.0, 4, 0.05) == pytest.approx(5 / 1.2)
    assert theoretical_speedup(0.8, 4, 0.0) == pytest.approx((1 - 0.8**5) / 0.2)
    a, k, c = 0.7, 5, 0.05
    assert theoretical_speedup(a, k, c) == pytest.approx((1 - a ** (k + 1)) / ((1 - a) * (1 + k * c)))
    assert theoretical_speedup(0.5, 0, 0.1) == 1.0


def test_round_row_fields():
    ev = make_round(3, accepted=("a", "b"), rejected=("x", "y"), final="c", origin=Origin.CORRECTED, k=4,
                    draft_ms=4.0, verify_ms=6.0, temperature=0.7)
    stats = SessionStats()
    rec = stats.begin("hi")
    rec.rounds.append(ev)
    (row,) = stats.round_rows()
    assert list(row) == list(ROUND_COLUMNS)
    assert row["chat"] == 1 and row["message"] == 1 and row["kind"] == "chat"
    assert (row["round"], row["mode"], row["drafter"]) == (3, "speculative", "model")
    assert (row["k"], row["temperature"]) == (4, 0.7)
    assert (row["drafted"], row["accepted"], row["committed"]) == (4, 2, 3)
    assert (row["final_origin"], row["final_token"], row["final_token_id"]) == ("corrected", "c", 300)
    assert row["tokens_per_s"] == pytest.approx(3 / 0.010)
    assert round_tokens_per_s(ev) == pytest.approx(300.0)


def test_plain_and_bonus_rows():
    plain = make_round(1, accepted=(), final="z", origin=Origin.PLAIN, mode="plain", draft_ms=0.0)
    bonus = make_round(2, accepted=("a", "b"), final="c", origin=Origin.BONUS)
    stats = SessionStats()
    stats.begin("q").rounds.extend([plain, bonus])
    rows = stats.round_rows()
    assert rows[0]["mode"] == "plain" and rows[0]["drafter"] == "" and rows[0]["k"] == 0
    assert rows[0]["final_origin"] == "plain"
    assert rows[1]["final_origin"] == "bonus" and rows[1]["accepted"] == 2


def test_csv_round_trip_and_summary_file(tmp_path):
    stats = SessionStats()
    first = [make_round(1, ("a",), ("x",), "b"), make_round(2, ("c", "d"), (), "e", Origin.BONUS, stop_reason="eos")]
    rec = stats.begin('say "hi", please')
    rec.rounds.extend(first)
    rec.summary = make_summary(first, reused=0)
    stats.new_chat()
    rec2 = stats.begin("again")
    second = [make_round(1, (), (), "q", Origin.PLAIN, mode="plain")]
    rec2.rounds.extend(second)
    rec2.summary = make_summary(second, reused=7, stop="cancelled")

    main, side = stats.write_csv(tmp_path / "session.csv")
    assert side == tmp_path / "session_summary.csv" == summary_path(main)
    with main.open(newline="") as f:
        rows = list(csv.DictReader(f))
    assert [r["message"] for r in rows] == ["1", "1", "2"]
    assert [r["chat"] for r in rows] == ["1", "1", "2"]
    assert [r["round"] for r in rows] == ["1", "2", "1"]
    assert rows[0]["final_token"] == "b" and rows[1]["final_origin"] == "bonus" and rows[2]["mode"] == "plain"
    with side.open(newline="") as f:
        summ = list(csv.DictReader(f))
    assert list(summ[0]) == list(SUMMARY_COLUMNS)
    assert summ[0]["prompt"] == 'say "hi", please'
    assert summ[0]["new_tokens"] == "5" and summ[0]["drafted"] == "4" and summ[0]["accepted"] == "3"
    assert summ[1]["reused_prefix_tokens"] == "7" and summ[1]["stop_reason"] == "cancelled"
    assert summ[1]["mode"] == "plain"


def test_unfinished_message_still_summarised():
    stats = SessionStats()
    stats.begin("x").rounds.append(make_round(1))
    (row,) = stats.summary_rows()
    assert row["stop_reason"] == "error" and row["rounds"] == 1 and row["new_tokens"] == 2


def test_unwritable_path_raises(tmp_path):
    stats = SessionStats()
    with pytest.raises(OSError):
        stats.write_csv(tmp_path / "missing-dir" / "x.csv")


def _session(prompt: str) -> SessionStats:
    stats = SessionStats()
    rounds = [make_round(1, ("a",), ("x",), "b", stop_reason="eos")]
    rec = stats.begin(prompt)
    rec.rounds.extend(rounds)
    rec.summary = make_summary(rounds, reused=0)
    return stats


def test_a_failed_export_leaves_the_earlier_export_whole(tmp_path, monkeypatch):
    """The disk fills while the second file is written; the first export stays, both files."""
    path = tmp_path / "session.csv"
    _session("first").write_csv(path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    later = _session("first")
    later.begin("second").rounds.append(make_round(1))
    real, calls = csv.DictWriter.writerows, []

    def writerows(self, rows):
        calls.append(1)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(self, rows)

    monkeypatch.setattr(csv.DictWriter, "writerows", writerows)
    with pytest.raises(OSError, match="No space"):
        later.write_csv(path)
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no temporaries left either
    monkeypatch.undo()
    later.write_csv(path)
    assert "second" in summary_path(path).read_text(encoding="utf-8")


def test_an_export_keeps_the_permissions_of_the_file_it_replaces(tmp_path):
    path = tmp_path / "session.csv"
    path.write_text("old", encoding="utf-8")
    path.chmod(0o640)
    _session("x").write_csv(path)
    assert path.stat().st_mode & 0o777 == 0o640


def test_an_export_never_fails_on_a_lone_surrogate(tmp_path):
    """Text that reached the session (a trace, a paste) cannot break saving."""
    main, side = _session("a\ud800b").write_csv(tmp_path / "s.csv")
    with side.open(newline="", encoding="utf-8") as f:
        assert next(csv.DictReader(f))["prompt"] == "a?b"


def test_summary_path_names():
    assert summary_path("/a/b/stats.csv").name == "stats_summary.csv"
    assert summary_path("/a/b/stats").name == "stats_summary.csv"


def test_new_chat_numbering_skips_empty_chats():
    s = SessionStats()
    s.new_chat()  # nothing in chat 1 yet: stays 1
    assert s.begin("a").chat == 1
    s.new_chat()
    assert s.begin("b").chat == 2 and len(s) == 2


def test_speed_totals_with_and_without_plain_rate():
    t = SpeedTotals()
    # 4 drafted at 1 ms each, 10 ms verify, 3 accepted + 1 correction = 4 tokens per round; each round ends 20 ms
    # after the one before (6 ms of catch-up, sampling and rollback besides drafting and verifying).
    for r in range(1, 4):
        t.add(make_round(r, ("a", "b", "c"), ("x",), "d", draft_ms=4.0, verify_ms=10.0, elapsed_s=0.5 + 0.02 * r))
    assert t.drafting.alpha == pytest.approx(0.75) and t.drafting.mean_k == 4
    # No plain step timed: c = 1 ms per draft / 10 ms verify (the verify pass stands in), and no measured speedup,
    # which no estimate stands in for.
    assert t.plain_ms_per_token is None and t.step_ms_per_pass is None
    assert t.cost_ratio() == pytest.approx(0.1)
    assert t.measured_speedup() is None
    # A run of two plain rounds whose one-row passes took 8 ms, each ending 10 ms after the round before it.
    t.add(make_round(4, (), (), "p", Origin.PLAIN, mode="plain", draft_ms=0.0, verify_ms=8.0, elapsed_s=0.57))
    t.add(make_round(5, (), (), "q", Origin.PLAIN, mode="plain", draft_ms=0.0, verify_ms=8.0, elapsed_s=0.58))
    assert t.plain_ms_per_token == pytest.approx(8.0)
    assert t.cost_ratio() == pytest.approx(1 / 8)
    # Wall time on both sides, round 1 (the prefills) and the run's first plain round on neither: 8 tokens in 40 ms
    # against 1 in 10 ms
    assert (t.spec_wall.rounds, t.spec_wall.committed, t.plain_wall.rounds) == (2, 8, 1)
    assert t.measured_speedup() == pytest.approx((8 / 0.04) / (1 / 0.01))
    assert t.theoretical_speedup() == pytest.approx(theoretical_speedup(0.75, 4, 1 / 8))
    # An explicit session reference wins in the theory's c.
    assert t.cost_ratio(2.0) == pytest.approx(0.5)


def test_the_measured_speedup_counts_what_the_user_waits_for():
    """The chart once divided by draft_ms + verify_ms alone, leaving out the draft model's catch-ups, sampling,
    rollback and the engine's per-round work, which the speculative rounds pay and a plain step hardly does: it
    read 1.96x where Compare's wall-clock A/B said 0.90x. Both sides are the rounds' own wall time now."""
    t = SpeedTotals()
    elapsed = 2.0  # round 1 ends after a 2 s prompt prefill: left out
    t.add(make_round(1, ("a",), ("x",), "d", draft_ms=10.0, verify_ms=20.0, elapsed_s=elapsed))
    for r in range(2, 12):
        # 2 tokens a round in 30 ms of drafting and verifying, but 45 ms apart: a 15 ms catch-up each time
        elapsed += 0.045
        ev = make_round(r, ("a",), ("x",), "d", draft_ms=10.0, verify_ms=20.0, elapsed_s=elapsed)
        t.add(dataclasses.replace(ev, draft_prefill_ms=15.0))
    for r in (12, 13):  # a run of plain steps: 28 ms passes, 30 ms apart; the first is timed on neither side
        elapsed += 0.03
        t.add(make_round(r, (), (), "p", Origin.PLAIN, mode="plain", draft_ms=0.0, verify_ms=28.0, elapsed_s=elapsed))
    assert t.measured_speedup() == pytest.approx((20 / 0.45) / (1 / 0.03))  # 1.33x, not 2 * 28 / 30 = 1.87x
    assert t.spec_wall.seconds == pytest.approx(0.45)


def test_the_wall_time_starts_over_with_each_request():
    """A conversation's totals add several replies: each one's round 1 (its prompt) is left out, and a gap is
    never taken across two requests."""
    t = SpeedTotals()
    for elapsed in (0.0, 100.0):  # two replies; the second's clock starts over, much later in the session
        t.add(make_round(1, ("a",), ("x",), "d", elapsed_s=elapsed + 1.0))
        t.add(make_round(2, ("a",), ("x",), "d", elapsed_s=elapsed + 1.1))
        t.add(make_round(3, (), (), "p", Origin.PLAIN, mode="plain", elapsed_s=elapsed + 1.15))
        t.add(make_round(4, (), (), "p", Origin.PLAIN, mode="plain", elapsed_s=elapsed + 1.2))
    assert (t.spec_wall.rounds, t.plain_wall.rounds) == (2, 2)
    assert t.spec_wall.seconds == pytest.approx(0.2) and t.plain_wall.seconds == pytest.approx(0.1)
    # the second reply's round 1 follows the first reply's plain round 4, and is still no plain step
    assert t.plain_wall.committed == 2
    skipped = SpeedTotals()  # a round whose predecessor was not added here has no gap
    skipped.add(make_round(5, ("a",), ("x",), "d", elapsed_s=3.0))
    skipped.add(make_round(7, ("a",), ("x",), "d", elapsed_s=3.5))
    assert skipped.spec_wall.rounds == 0 and skipped.measured_speedup() is None


def test_speed_totals_keep_each_drafter_apart():
    """Under the hybrid drafter, model rounds and free n-gram rounds alternate. One α and one c over both would
    describe neither: the theory is the mix of their rounds, each at its own α, K and c."""
    t = SpeedTotals()
    plain = 10.0
    for r in range(4):  # the model: 4 drafted at 1 ms each, 3 pass
        t.add(make_round(r, ("a", "b", "c"), ("x",), "d", drafter="model", draft_ms=4.0, verify_ms=12.0))
    for r in range(4, 6):  # the n-gram lookup: 8 drafted at no cost, all pass
        t.add(make_round(r, tuple("abcdefgh"), (), "i", drafter="ngram", draft_ms=0.0, verify_ms=16.0))
    model, ngram = t.by_drafter["model"], t.by_drafter["ngram"]
    assert (model.rounds, model.alpha, model.mean_k, model.cost_ratio(plain)) == (4, 0.75, 4, pytest.approx(0.1))
    assert (ngram.rounds, ngram.alpha, ngram.mean_k, ngram.cost_ratio(plain)) == (2, 1.0, 8, 0.0)
    tokens = 4 * (1 - 0.75 ** 5) / 0.25 + 2 * 9  # expected tokens of each drafter's rounds
    cost = 4 * (1 + 4 * 0.1) + 2 * 1  # in target steps
    assert t.theoretical_speedup(plain) == pytest.approx(tokens / cost)
    # Pooled into one α (28/32), one K (5.3) and one c, the formula would say 3.60x where the mix gives 3.97x.
    pooled = theoretical_speedup(t.drafting.alpha, t.drafting.mean_k, t.cost_ratio(plain))
    assert abs(pooled / t.theoretical_speedup(plain) - 1) > 0.05
    # One drafter alone is Leviathan's formula exactly.
    alone = SpeedTotals()
    for r in range(4):
        alone.add(make_round(r, ("a", "b", "c"), ("x",), "d", drafter="model", draft_ms=4.0, verify_ms=12.0))
    assert alone.theoretical_speedup(plain) == pytest.approx(theoretical_speedup(0.75, 4, 0.1))


def test_speed_totals_empty():
    t = SpeedTotals()
    assert t.measured_speedup() is None and t.theoretical_speedup() is None and t.drafting.alpha == 0.0
    assert not math.isnan(t.cost_ratio())


def test_a_folder_named_like_the_summary_fails_the_export_and_changes_nothing(tmp_path):
    """Formerly NAME.csv was replaced before the rename onto the summary's folder failed: half an export."""
    path = tmp_path / "session.csv"
    path.write_text("old rounds", encoding="utf-8")
    summary_path(path).mkdir()
    with pytest.raises(IsADirectoryError):
        _session("new").write_csv(path)
    assert path.read_text(encoding="utf-8") == "old rounds"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["session.csv", "session_summary.csv"]


def test_a_rename_that_fails_puts_back_the_files_renamed_before_it(tmp_path, monkeypatch):
    import os

    path = tmp_path / "session.csv"
    _session("first").write_csv(path)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    real, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:  # the summary's rename, after the rounds' went through
            raise PermissionError(13, "Permission denied", str(dst))
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    later = _session("second")
    with pytest.raises(PermissionError):
        later.write_csv(path)
    monkeypatch.undo()
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before  # no temporaries or backups left


def test_a_failed_first_export_leaves_no_file(tmp_path, monkeypatch):
    import os

    path = tmp_path / "fresh.csv"
    real, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise PermissionError(13, "Permission denied", str(dst))
        return real(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    with pytest.raises(PermissionError):
        _session("x").write_csv(path)
    monkeypatch.undo()
    assert list(tmp_path.iterdir()) == []


def test_a_reply_of_both_drafters_has_one_name_whichever_drafted_first():
    names = []
    for first, second in (("model", "ngram"), ("ngram", "model")):
        events = [make_round(1, drafter=first), make_round(2, drafter=second)]
        rec = MessageRecord(1, 1, "chat", "p", rounds=events, summary=make_summary(events))
        names.append(summary_row(rec)["drafter"])
    assert names == ["model+ngram", "model+ngram"]


def test_a_round_that_drafted_nothing_stays_on_the_speculative_side():
    """The hybrid's policy may draft nothing in a round (its one-row pass still feeds c's reference step), but the
    user waited for that round with speculation on: its wall time is the speculative side's, never the plain
    basis, which is the plain rounds' alone."""
    t = SpeedTotals()
    t.add(make_round(1, ("a",), ("x",), "d", elapsed_s=1.0))
    t.add(make_round(2, (), (), "n", Origin.PLAIN, drafter="ngram", verify_ms=9.0, elapsed_s=1.05))  # drafted nothing
    assert t.step_passes == 1 and t.spec_wall.rounds == 1 and t.plain_wall.rounds == 0
    assert t.measured_speedup() is None  # no plain round yet: a round that drafted nothing is no plain basis
    t.add(make_round(3, (), (), "p", Origin.PLAIN, mode="plain", drafter=None, verify_ms=9.0, elapsed_s=1.07))
    t.add(make_round(4, (), (), "p", Origin.PLAIN, mode="plain", drafter=None, verify_ms=9.0, elapsed_s=1.09))
    assert t.measured_speedup() == pytest.approx((1 / 0.05) / (1 / 0.02))


def test_a_plain_step_after_speculative_rounds_is_timed_on_neither_side():
    """Under a busy core the first plain step after speculative rounds ran faster than plain decoding does (in the
    window 93-134 ms a token against Compare's 161-176 ms), and a basis of such steps read the speedup as low as
    0.47 of Compare's: the plain basis is the steps that follow a plain step (engine.api.live.PLAIN_RUN)."""
    t = SpeedTotals()
    elapsed = 1.0
    t.add(make_round(1, ("a",), ("x",), "d", elapsed_s=elapsed))
    for r, mode, gap in ((2, "speculative", 0.3), (3, "plain", 0.05), (4, "plain", 0.15), (5, "plain", 0.13),
                         (6, "speculative", 0.3), (7, "plain", 0.06), (8, "plain", 0.12)):
        elapsed += gap
        ev = (make_round(r, ("a",), ("x",), "d", elapsed_s=elapsed) if mode == "speculative" else
              make_round(r, (), (), "p", Origin.PLAIN, mode="plain", drafter=None, elapsed_s=elapsed))
        t.add(ev)
    # rounds 3 and 7 (quick, after speculative rounds) on neither side; 4, 5 and 8 are the basis
    assert (t.plain_wall.rounds, t.spec_wall.rounds) == (3, 2)
    assert t.plain_wall.seconds == pytest.approx(0.40)
    assert t.spec_wall.seconds == pytest.approx(0.60)
    assert t.measured_speedup() == pytest.approx((4 / 0.6) / (3 / 0.4))


def test_the_plain_basis_says_how_loosely_its_few_steps_pin_the_rate():
    """Steps that alternate quick and preempted (a 2-core machine with one core busy) give a rate that a handful of
    them only loosely pins down; steady steps pin it closely."""
    from engine.analysis.stats import WallTotals

    ev = make_round(1, (), (), "p", Origin.PLAIN, mode="plain", drafter=None, draft_ms=0.0)
    steady, bimodal = WallTotals(), WallTotals()
    assert steady.relative_error is None
    for t in (0.050, 0.051, 0.049, 0.050):
        steady.add(ev, t)
    for t in (0.10, 0.34, 0.10, 0.32, 0.11):
        bimodal.add(ev, t)
    assert steady.relative_error == pytest.approx(0.0082, abs=1e-3)
    # the sample standard deviation, 0.124 s, over sqrt(5), around a mean of 0.194 s
    assert bimodal.relative_error == pytest.approx(0.1244 / 5 ** 0.5 / 0.194, rel=1e-3)
    assert bimodal.relative_error > 0.25 > 0.01 > steady.relative_error
