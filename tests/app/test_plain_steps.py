"""A chat reply's plain steps: the measured speedup's basis, timed in the same minutes as the reply."""
from app.controller import PLAIN_EVERY
from engine.api.live import PLAIN_FIRST
from tests.app_fixtures import CODE_REPLY, fake, wait_idle


def test_a_chat_reply_times_its_own_plain_steps(qtbot, make_window, engine_log):
    """Through the real host and a scripted engine: each probe is one plain round, speculation comes back after it
    without the window's word, the reply is the same text, and the chart's speedup stands on those plain steps."""
    w = make_window(fake(round_delay=0.03, log=str(engine_log.path)), show=False)
    w.input.setPlainText("Write fib")
    w.send()
    wait_idle(qtbot, w, timeout=20000)
    rounds = w.controller.stats.records[0].rounds
    modes = [ev.mode for ev in rounds]
    assert "plain" in modes, modes
    first = modes.index("plain")
    assert rounds[first].round == PLAIN_FIRST and "speculative" in modes[first:], modes
    assert [ev.round for ev in rounds if ev.mode == "plain"] == list(range(PLAIN_FIRST, len(rounds) + 1, PLAIN_EVERY))
    assert "plain" not in {modes[i + 1] for i, m in enumerate(modes[:-1]) if m == "plain"}, modes  # one at a time
    assert "".join(ev.text_delta for ev in rounds) == CODE_REPLY
    b = w.charts.buffer
    assert b.plain_ms is not None and b.reply.step_passes == modes.count("plain")
    assert b.reply.measured_speedup() is not None
    assert "\u2014" not in w.charts.plots["speedup"].titleLabel.item.toPlainText()
