"""Run > Compare: the last prompt with speculation off, then on, same seed and settings."""
import pytest

from app.session.verdict import compare
from tests.app_fixtures import CODE_REPLY, fake, make_round, make_summary, wait_idle


def test_compare_replays_last_prompt_off_then_on(qtbot, window, engine_log):
    window.controls.system_edit.setPlainText("Be terse.")
    window.input.setPlainText("Write fib")
    window.send()
    wait_idle(qtbot, window)
    window.controls.seed_spin.setValue(99)  # changed after the message: Compare replays what was sent
    assert window.compare_action.isEnabled()
    dlg = window.compare()
    assert dlg is not None and not window.send_button.isEnabled()
    qtbot.waitUntil(lambda: dlg.verdict is not None, timeout=10000)
    plain, spec = dlg.sides
    requests = engine_log.requests
    assert requests[-1] == requests[-2] == requests[0]
    assert {r.mode for r in plain.record.rounds} == {"plain"}
    assert "speculative" in {r.mode for r in spec.record.rounds}
    v = dlg.verdict
    assert v.identical and v.greedy and v.ok
    assert v.speedup == pytest.approx(spec.summary.tokens_per_s / plain.summary.tokens_per_s)
    assert "identical" in dlg.verdict_label.text() and "speedup" in dlg.verdict_label.text()
    assert plain.view.reply_text() == spec.view.reply_text() == CODE_REPLY
    assert "tok/s" in plain.stats_label.text() and "acceptance" in spec.stats_label.text()
    assert "(this replay)" in spec.stats_label.text()  # its scope, beside the chart's "this reply"
    # Both runs are in the session stats, labelled; the chat's charts count neither side (each reply's speedup
    # stands on its own plain steps, never on a replay's rate from other minutes).
    stats = window.controller.stats
    assert [r.kind for r in stats.records] == ["chat", "compare-plain", "compare-speculative"]
    assert plain.record is stats.records[1] and spec.record is stats.records[2]
    assert plain.record.summary is plain.summary and spec.record.summary is spec.summary
    assert len(window.charts.buffer.x) == len(stats.records[0].rounds)
    assert window.charts.buffer.totals.drafting.drafted == sum(len(r.drafted) for r in stats.records[0].rounds)
    qtbot.waitUntil(lambda: window.send_button.isEnabled(), timeout=5000)
    dlg.close()


def test_compare_uses_one_seed_for_both_sides(qtbot, make_window, engine_log):
    w = make_window(fake(log=str(engine_log.path)), show=False)
    w.controls.temp_slider.setValue(70)  # sampling, seed "random"
    w.input.setPlainText("hi")
    w.send()
    wait_idle(qtbot, w)
    dlg = w.compare()
    qtbot.waitUntil(lambda: not dlg.running, timeout=10000)
    (_, first), (s1, off), (s2, on) = engine_log.generates
    assert s1 == s2 and s1 is not None and (off, on) == (False, True)
    assert not dlg.verdict.greedy and "distribution" in dlg.verdict.note
    dlg.close()


def test_compare_stop(qtbot, make_window, engine_log):
    w = make_window(fake(round_delay=0.03, log=str(engine_log.path)), show=False)
    w.controls.max_tokens_spin.setValue(6)
    w.input.setPlainText("hi")
    w.send()
    wait_idle(qtbot, w)
    w.controls.max_tokens_spin.setValue(256)
    dlg = w.compare()
    qtbot.waitUntil(lambda: len(engine_log.seen) > 4, timeout=5000)
    dlg.stop()
    qtbot.waitUntil(lambda: not dlg.running, timeout=5000)
    assert dlg.verdict is None and "incomplete" in dlg.verdict_label.text()
    assert not w.controller.busy


def test_compare_needs_a_prompt(window):
    assert not window.compare_action.isEnabled()
    assert window.compare() is None


def test_verdict_detects_a_difference_under_greedy():
    a = make_summary([make_round(1, ("x",), (), "y")])
    b = make_summary([make_round(1, ("x",), (), "z")])
    b = type(b)(**{**b.__dict__, "token_ids": (1, 2)})
    v = compare(a, b, greedy=True)
    assert not v.identical and not v.ok and "should not happen" in v.note
