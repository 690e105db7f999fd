"""ChartsPanel: scripted rounds reach every plot, and redraws happen only on flush."""
import dataclasses

import numpy as np
import pytest

from app.views.chart_data import TimeBudget, nice_ceiling, rolling_mean
from app.views.charts import ChartsPanel
from engine.analysis.theory import theoretical_speedup
from engine.api.events import Origin
from tests.app_fixtures import make_round


def rounds():
    return [
        make_round(1, ("a", "b", "c"), ("x",), "d", k=4, draft_ms=4.0, verify_ms=10.0),  # 3 of 4
        make_round(2, ("a", "b", "c", "d"), (), "e", Origin.BONUS, k=4, draft_ms=4.0, verify_ms=10.0),  # 4 of 4
        make_round(3, (), ("x", "y", "z", "w"), "d", k=4, draft_ms=4.0, verify_ms=10.0),  # 0 of 4
        make_round(4, ("a",), ("x", "y"), "d", k=3, draft_ms=3.0, verify_ms=10.0),  # 1 of 3 (adaptive K)
    ]


@pytest.fixture
def panel(qtbot):
    p = ChartsPanel()
    qtbot.addWidget(p)
    p.resize(700, 700)
    p.show()
    return p


def test_rolling_mean():
    assert np.allclose(rolling_mean(np.array([1.0, 3.0, 5.0, 7.0]), 2), [1, 2, 4, 6])
    assert len(rolling_mean(np.array([]))) == 0


def test_charts_receive_points(panel):
    for ev in rounds():
        panel.feed(ev)
    assert panel.flush(full=True) is True
    x, y = panel.curves["acceptance"].getData()
    assert list(x) == [1, 2, 3, 4] and np.allclose(y, [0.75, 1.0, 0.0, 1 / 3])
    assert len(panel.curves["acceptance_mean"].getData()[0]) == 4
    x, y = panel.curves["tokens"].getData()
    assert np.allclose(y, [4 / 14 * 1000, 5 / 14 * 1000, 1 / 14 * 1000, 2 / 13 * 1000])
    assert list(panel.curves["k"].getData()[1]) == [4, 4, 4, 3]
    assert list(panel.curves["drafted"].getData()[1]) == [len(ev.drafted) for ev in rounds()]
    hist = panel.bars["histogram"].opts["height"]
    assert list(hist) == [1, 1, 0, 1, 1]  # accepted 0, 1, 3, 4 once each
    pos = panel.bars["position"].opts["height"]
    assert np.allclose(pos, [3 / 4, 2 / 4, 2 / 4, 1 / 3])
    _, theory = panel.curves["theoretical"].getData()
    assert len(theory) == 4
    t = panel.buffer.totals
    assert theory[-1] == pytest.approx(theoretical_speedup(t.drafting.alpha, t.drafting.mean_k, t.cost_ratio()))
    assert "Speedup" in panel.plots["speedup"].titleLabel.text


def _timed(ev, elapsed_s: float):
    return dataclasses.replace(ev, elapsed_s=elapsed_s)


def test_speedup_shows_only_what_is_measured(panel):
    """Before the reply has timed a plain step there is no measured speedup, a dash and a tooltip saying why; from
    its first plain step on, the measured curve is drawn: both sides in the rounds' wall time, round 1 on neither."""
    for i, ev in enumerate(rounds()):  # 20 ms apart, though each drafted and verified for 13-14 ms
        panel.feed(_timed(ev, 1.0 + 0.02 * i))
    panel.flush(full=True)
    title = panel.plots["speedup"].titleLabel.item.toPlainText()
    assert "Speedup \u2014 vs plain measured this reply" == title
    assert len(panel.curves["measured"].getData()[0] or []) == 0
    assert "no plain step yet" in panel.plots["speedup"].toolTip().replace("timed no plain step yet", "no plain step yet")
    first = make_round(5, (), (), "p", Origin.PLAIN, mode="plain", drafter=None, draft_ms=0.0, verify_ms=20.0)
    panel.feed(_timed(first, 1.08))  # after speculative rounds: timed on neither side
    panel.flush(full=True)
    assert "Speedup \u2014 vs plain measured this reply" == panel.plots["speedup"].titleLabel.item.toPlainText()
    plain = make_round(6, (), (), "p", Origin.PLAIN, mode="plain", drafter=None, draft_ms=0.0, verify_ms=20.0)
    panel.feed(_timed(plain, 1.11))  # 30 ms after round 5
    panel.feed(_timed(make_round(7, ("a",), ("x",), "d", k=2, draft_ms=2.0, verify_ms=12.0), 1.13))
    panel.flush(full=True)
    x, measured = panel.curves["measured"].getData()
    assert list(x) == [5, 6, 7] and np.isnan(measured[:2]).all()  # rounds 5 and 6 are plain steps: a break
    # rounds 2, 3, 4 and 7: 10 tokens in 80 ms, against 1 token in 30 ms
    assert measured[2] == pytest.approx((10 / 0.08) / (1 / 0.03))
    title = panel.plots["speedup"].titleLabel.text
    assert f"{measured[-1]:.2f}\u00d7</span> vs plain measured this reply" in title
    tip = panel.plots["speedup"].toolTip()
    assert "10 tokens in 0.1 s" in tip and "1 timed plain step" in tip and "1 tokens in 0.03 s" in tip


def test_a_loose_plain_basis_says_so_in_the_title_and_the_tip(panel):
    """Plain steps that alternate quick and preempted (one 20 ms, one 60 ms) pin the plain rate down loosely: the
    title carries the speedup's standard error and the tooltip says where it comes from; steady steps add nothing."""
    t, rnd = 1.0, 0

    def feed(ev, gap):
        nonlocal t
        t += gap
        panel.feed(_timed(ev, t))

    def plain_step(gap):
        nonlocal rnd
        rnd += 1
        feed(make_round(rnd, (), (), "p", Origin.PLAIN, mode="plain", drafter=None, draft_ms=0.0), gap)

    def spec_round():
        nonlocal rnd
        rnd += 1
        feed(make_round(rnd, ("a", "b"), ("x",), "d", k=2, draft_ms=2.0, verify_ms=12.0), 0.03)

    spec_round()  # round 1: the prefills, on neither side
    for gap in (0.020, 0.021, 0.020):
        spec_round()
        plain_step(0.040)  # a run's first plain step, after speculative rounds: not timed
        plain_step(gap)
    panel.flush(full=True)
    assert "\u00b1" not in panel.plots["speedup"].titleLabel.text  # steady: 3% at most
    for gap in (0.060, 0.020, 0.060):
        spec_round()
        plain_step(0.040)  # a run's first plain step, after speculative rounds: not timed
        plain_step(gap)
    panel.flush(full=True)
    err = panel.buffer.reply.plain_wall.relative_error
    assert err > 0.2
    assert f"\u00d7</span> \u00b1{err:.0%} vs plain measured this reply" in panel.plots["speedup"].titleLabel.text
    assert f"uncertain by \u00b1{err:.0%} (one standard error)" in panel.plots["speedup"].toolTip()


def test_hybrid_rounds_show_each_drafters_inputs(panel):
    """Under the hybrid drafter the speedup note gives α, K and c per drafter, and the theory is their mix."""
    panel.feed(make_round(0, (), (), "p", Origin.PLAIN, mode="plain", drafter=None, draft_ms=0.0, verify_ms=10.0))
    for ev in rounds():
        panel.feed(ev)
    panel.flush(full=True)
    assert panel.speedup_note.toPlainText().count("\u03b1") == 1 and "n-gram" not in panel.speedup_note.toPlainText()
    panel.feed(make_round(5, tuple("abcdef"), (), "g", Origin.BONUS, k=6, drafter="ngram", draft_ms=0.0))
    panel.flush(full=True)
    note = panel.speedup_note.toPlainText().splitlines()
    assert note[0] == "draft model: \u03b1 0.53  K 3.8  c 0.10"  # 8 of 15 in 4 rounds, 15 ms over 15 drafts
    assert note[1] == "n-gram: \u03b1 1.00  K 6.0  c 0.00 \u00b7 this reply"
    _, theory = panel.curves["theoretical"].getData()
    assert theory[-1] == pytest.approx(panel.buffer.reply.theoretical_speedup(10.0))
    assert panel.legend_labels["theoretical"].text == f"theory {theory[-1]:.2f}\u00d7"


def test_flush_only_redraws_on_change(panel):
    panel.budget = TimeBudget(share=1.0, burst=10.0)  # this test is about change tracking, not the budget
    panel.flush(full=True)
    before = panel.repaints
    assert panel.flush() is False and panel.repaints == before
    panel.feed(rounds()[0])
    assert panel.repaints == before  # feeding never draws
    # One plot per flush, then nothing left to do.
    for i in range(1, 7):
        assert panel.flush() is True and panel.repaints == before + i
    assert panel.flush() is False
    assert len(panel.curves["acceptance"].getData()[0]) == len(panel.curves["k"].getData()[0]) == 1


def test_an_early_stop_shows_as_fewer_drafted_than_k(panel):
    panel.feed(make_round(1, ("a",), ("x",), "d", k=6, draft_ms=2.0, verify_ms=10.0))  # stopped after 2 of 6
    panel.feed(make_round(2, (), (), "p", Origin.PLAIN, mode="plain", draft_ms=0.0, verify_ms=20.0))
    panel.flush(full=True)
    k, drafted = panel.curves["k"].getData()[1], panel.curves["drafted"].getData()[1]
    assert k[0] == 6 and drafted[0] == 2
    assert np.isnan(k[1]) and np.isnan(drafted[1])  # nothing drafted in plain mode


def test_plain_reference_line(panel):
    """The dashed plain line is the current reply's own plain step, and a new reply starts without one."""
    assert not panel.plain_line.isVisible()
    panel.feed(make_round(1, (), (), "p", Origin.PLAIN, mode="plain", draft_ms=0.0, verify_ms=20.0))
    panel.flush(full=True)
    assert panel.plain_line.isVisible() and panel.plain_line.value() == pytest.approx(50.0)
    assert np.isnan(panel.curves["k"].getData()[1][0])  # no K in plain mode
    assert "plain 50.0</span> this reply" in panel.plots["tokens"].titleLabel.text
    panel.start_message()
    panel.feed(rounds()[0])
    panel.flush(full=True)
    assert not panel.plain_line.isVisible() and "plain" not in panel.plots["tokens"].titleLabel.text
    panel.feed(make_round(3, (), (), "p", Origin.PLAIN, mode="plain", draft_ms=0.0, verify_ms=10.0))
    panel.flush(full=True)
    assert panel.plain_line.value() == pytest.approx(100.0)


def test_clear_forgets_the_basis_and_marks_messages(panel):
    panel.start_message()
    panel.feed(make_round(1, (), (), "p", Origin.PLAIN, mode="plain", draft_ms=0.0, verify_ms=20.0))
    panel.start_message()
    panel.feed(rounds()[1])
    panel.flush(full=True)
    assert len(panel._markers) == 4  # one boundary, drawn on the four per-round plots
    panel.clear()
    assert len(panel.curves["acceptance"].getData()[0] or []) == 0
    assert panel._markers == [] and not panel.plain_line.isVisible()


def test_nice_ceiling():
    assert [nice_ceiling(v) for v in (0, 0.7, 1, 1.1, 2.2, 3, 7, 11, 260)] == [1, 1, 1, 2, 2.5, 5, 10, 20, 500]


def test_time_budget_limits_chart_work(panel, monkeypatch):
    clock = [100.0]
    monkeypatch.setattr("app.views.charts.time.perf_counter", lambda: clock[0])
    budget = TimeBudget(share=0.03, burst=0.03)
    assert budget.allow()
    budget.spend(0.05)  # one expensive paint overdraws the bucket ...
    assert not budget.allow()
    clock[0] += 0.5  # ... 0.5 s at 3% refills 15 ms: still 5 ms short
    assert not budget.allow()
    clock[0] += 0.5
    assert budget.allow()
    clock[0] += 100  # never more than the burst
    assert budget.allow() and budget.level == pytest.approx(0.03)
    # The panel skips its (non-final) flushes while the bucket is empty, and a final flush ignores it.
    panel.budget = budget
    panel.flush(full=True)
    panel.feed(rounds()[0])
    budget.spend(1.0)
    assert panel.flush() is False
    assert panel.flush(full=True) is True


def test_the_acceptance_lines_break_across_plain_rounds(panel):
    """After a speculation-off reply the lines ran straight across its plain rounds."""
    plain = [make_round(i, (), (), "p", Origin.PLAIN, mode="plain", drafter=None, draft_ms=0.0) for i in (3, 4)]
    nothing = make_round(7, (), (), "n", Origin.PLAIN, k=4, drafter="ngram")  # speculative, drafted nothing
    for ev in rounds()[:2] + plain + rounds()[2:] + [nothing]:
        panel.feed(ev)
    panel.flush(full=True)
    for name in ("acceptance", "acceptance_mean"):
        curve = panel.curves[name]
        x, y = curve.getData()
        assert list(x) == [1, 2, 3, 4, 5, 6], name  # round 7 drafted nothing: left out, the line runs over it
        assert np.isnan(y[2]) and np.isnan(y[3]) and np.isfinite(y[[0, 1, 4, 5]]).all(), name
        assert curve.opts["connect"] == "finite", name


def test_the_speedup_lines_break_across_plain_rounds(panel):
    """The measured and theory speedups (running totals)
    ran flat across a speculation-off reply's rounds while the acceptance line broke there."""
    spec = rounds()
    modes = ["s", "p", "p", "s", "s", "p", "p", "s"]  # a run of plain steps early: a basis from round 3 on
    for i, mode in enumerate(modes, 1):
        ev = (make_round(i, (), (), "p", Origin.PLAIN, mode="plain", drafter=None, draft_ms=0.0, verify_ms=20.0)
              if mode == "p" else dataclasses.replace(spec[i % 4], round=i))
        panel.feed(_timed(ev, 0.5 + 0.03 * i))
    panel.flush(full=True)
    x, y = panel.curves["measured"].getData()
    assert list(x) == [2, 3, 4, 5, 6, 7, 8]  # round 1 has no basis yet: no point
    assert np.isnan(y[[0, 1, 4, 5]]).all() and np.isfinite(y[[2, 3, 6]]).all()
    x, y = panel.curves["theoretical"].getData()
    assert list(x) == [1, 2, 3, 4, 5, 6, 7, 8]
    assert np.isnan(y[[1, 2, 5, 6]]).all() and np.isfinite(y[[0, 3, 4, 7]]).all()
    for name in ("measured", "theoretical"):
        assert panel.curves[name].opts["connect"] == "finite", name


def test_positions_with_few_drafts_are_faded_and_counted(panel):
    """One round at K = 16 drew sixteen full bars at 1.0."""
    panel.feed(make_round(1, tuple("abcdefghijklmnop"), (), "q", Origin.BONUS, k=16))
    panel.flush(full=True)
    opts = panel.bars["position"].opts
    assert list(opts["height"]) == [1.0] * 16
    assert all(b.alphaF() < 0.5 for b in opts["brushes"])
    assert panel.plots["position"].titleLabel.item.toPlainText() == "Acceptance by draft position"
    tip = panel.plots["position"].toolTip()  # the counts behind the bars, in words
    assert "n 1:" in tip and "fewer than 5 drafts" in tip
    for i in range(2, 7):
        panel.feed(make_round(i, ("a",), ("x",), "q", k=2))
    panel.flush(full=True)
    opts = panel.bars["position"].opts
    assert opts["brushes"][0].alphaF() == 1.0 and opts["brushes"][1].alphaF() == 1.0  # 6 drafts each
    assert opts["brushes"][2].alphaF() < 0.5
    assert "n 6\u20131" in panel.plots["position"].toolTip()


def _speedup_title(panel) -> str:
    return panel.plots["speedup"].titleLabel.text


def test_a_plain_rate_from_other_minutes_does_not_move_the_speedup(panel):
    """The chart divided each reply's rate by one plain rate averaged over the session: under a load that changes,
    a fast plain rate from quiet minutes made a slow reply look 10x faster. Scripted: steps get three times slower
    mid-session; each reply's speedup must follow its own plain steps."""
    def reply(slow: float) -> list:
        evs, elapsed = [], 0.5  # round 1 ends after the prompt's prefill
        for i in range(1, 41):
            if i % 16 in (4, 5):  # the reply's run of plain steps (the first one is not timed)
                elapsed += 0.02 * slow * (i > 1)
                evs.append(make_round(i, (), (), "p", Origin.PLAIN, mode="plain", drafter=None, draft_ms=0.0,
                                      verify_ms=20.0 * slow, elapsed_s=elapsed))
            else:  # 2 drafts at 5 ms, one passes, a 24 ms verify: 2 tokens in 34 ms
                elapsed += 0.034 * slow * (i > 1)
                evs.append(make_round(i, ("a",), ("x",), "d", k=2, draft_ms=10.0 * slow, verify_ms=24.0 * slow,
                                      elapsed_s=elapsed))
        return evs

    same_minutes = 2 * 20.0 / 34.0  # tokens a ms speculative over plain, in any minute alike: 1.18x
    panel.start_message()
    for ev in reply(1.0):  # quiet minutes
        panel.feed(ev)
    panel.flush(full=True)
    assert panel.buffer.reply.measured_speedup() == pytest.approx(same_minutes)
    panel.start_message()
    for ev in reply(3.0):  # a busy machine: every pass three times slower
        panel.feed(ev)
    panel.flush(full=True)
    assert panel.buffer.reply.measured_speedup() == pytest.approx(same_minutes)
    assert f"{same_minutes:.2f}\u00d7" in _speedup_title(panel)
    _, measured = panel.curves["measured"].getData()
    assert measured[-1] == pytest.approx(same_minutes)
    # The stale session-wide rate would have said this (the quiet minutes' plain steps over the busy reply)
    stale = panel.buffer.totals.plain_ms_per_token
    assert stale is not None and abs(2 * stale / (34.0 * 3) - same_minutes) > 0.2


def test_a_trace_shows_the_speedup_the_window_showed(qtbot):
    """A Compare replay in the trace enters neither side of the chat's charts, live or reopened."""
    from app.dialogs.trace_window import TraceWindow
    from app.session.trace import Trace
    from engine.analysis.stats import MessageRecord

    probe = make_round(5, (), (), "p", Origin.PLAIN, mode="plain", drafter=None, draft_ms=0.0, verify_ms=9.0)
    chat = MessageRecord(1, 1, "chat", "q", rounds() + [probe], None)
    plain = [make_round(i, (), (), "p", Origin.PLAIN, mode="plain", drafter=None, draft_ms=0.0, verify_ms=6.0)
             for i in (1, 2)]
    compare = MessageRecord(1, 2, "compare-plain", "q", plain, None)  # after the last chat reply
    viewer = TraceWindow(Trace((chat, compare)))
    qtbot.addWidget(viewer)
    live = ChartsPanel()
    qtbot.addWidget(live)
    live.start_message()
    for ev in chat.rounds:
        live.feed(ev)
    live.flush(full=True)
    viewer.charts.flush(full=True)
    assert live.buffer.plain_ms == viewer.charts.buffer.plain_ms == pytest.approx(9.0)
    assert _speedup_title(live) == _speedup_title(viewer.charts)
    assert viewer.charts.buffer.theoretical == pytest.approx(live.buffer.theoretical)


def _titles_fit(panel) -> list[str]:
    """The plots whose title text is wider than the plot."""
    return [name for name, p in panel.plots.items() if p.titleLabel.item.boundingRect().width() > p.width() + 1]


def test_a_narrow_panel_reflows_to_one_scrolled_column(qtbot):
    """Beside the inspector the panel is ~360 px wide, and two columns clipped every title."""
    from app.views.charts import PLOT_MIN_HEIGHT

    panel = ChartsPanel()
    qtbot.addWidget(panel)
    hybrid = [make_round(i, ("a", "b"), ("x",), "d", k=3, drafter="model" if i % 2 else "ngram") for i in range(1, 9)]
    for ev in hybrid:
        panel.feed(ev)
    for width, columns in ((360, 1), (700, 2), (360, 1)):
        panel.resize(width, 780)
        panel.show()
        qtbot.waitUntil(lambda: panel.columns == columns, timeout=2000)
        panel.flush(full=True)
        qtbot.wait(50)
        assert _titles_fit(panel) == [], (width, _titles_fit(panel))
        if columns == 1:
            assert all(p.height() >= PLOT_MIN_HEIGHT - 20 for p in panel.plots.values())
            assert panel.scroll.verticalScrollBar().maximum() > 0  # the rest is a scroll away
        else:
            assert panel.scroll.verticalScrollBar().maximum() == 0


@pytest.mark.parametrize("width", [360, 800])
def test_the_speedup_note_stays_above_the_curves(qtbot, width):
    """The formula's note ran across the curve (its peak comes in the first rounds)."""
    panel = ChartsPanel()
    qtbot.addWidget(panel)
    panel.resize(width, 780)
    panel.show()
    early = [make_round(i, ("a", "b", "c", "d"), (), "e", Origin.BONUS, k=4, draft_ms=0.5, verify_ms=10.0)
             for i in range(1, 4)]
    late = [make_round(i, (), ("x", "y"), "d", k=2, draft_ms=4.0, verify_ms=10.0) for i in range(4, 30)]
    for ev in early + late:  # no plain rate: the note has its longest text, three lines
        panel.feed(ev)
    panel.flush(full=True)
    qtbot.wait(50)
    panel.flush(full=True)
    vb = panel.plots["speedup"].vb
    note_bottom = panel.speedup_note.pos().y() + panel.speedup_note.boundingRect().height()
    (_, y_hi) = vb.viewRange()[1]
    top = np.nanmax(np.asarray(panel.buffer.theoretical, dtype=float))
    top_px = vb.height() * (1 - top / y_hi)  # pixels from the top of the plot
    assert top_px > note_bottom, (top_px, note_bottom)
