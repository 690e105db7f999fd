"""A chat reply's plain steps: the measured speedup's basis, timed in the same minutes as the reply."""
from app.controller import PLAIN_EVERY
from engine.api.live import PLAIN_FIRST, PLAIN_RUN
from tests.app_fixtures import CODE_REPLY, fake, wait_idle


def test_a_chat_reply_times_its_own_plain_steps(qtbot, make_window, engine_log):
    """Through the real host and a scripted engine: each probe is a run of PLAIN_RUN plain rounds, speculation comes
    back after it without the window's word, the reply is the same text, and the chart's speedup stands on the plain
    steps that follow a plain step."""
    w = make_window(fake(round_delay=0.03, log=str(engine_log.path)), show=False)
    w.input.setPlainText("Write fib")
    w.send()
    wait_idle(qtbot, w, timeout=20000)
    rounds = w.controller.stats.records[0].rounds
    modes = [ev.mode for ev in rounds]
    assert "plain" in modes, modes
    first = modes.index("plain")
    assert rounds[first].round == PLAIN_FIRST and "speculative" in modes[first:], modes
    starts = range(PLAIN_FIRST, len(rounds) + 1, PLAIN_EVERY)
    assert len(starts) >= 2, modes
    assert [ev.round for ev in rounds if ev.mode == "plain"] == [
        s + i for s in starts for i in range(PLAIN_RUN) if s + i <= len(rounds)]
    assert "".join(ev.text_delta for ev in rounds) == CODE_REPLY
    b = w.charts.buffer
    assert b.plain_ms is not None and b.reply.step_passes == modes.count("plain")
    assert b.reply.measured_speedup() is not None
    after_plain = sum(m == "plain" and modes[i - 1] == "plain" for i, m in enumerate(modes) if i)
    assert b.reply.plain_wall.rounds == after_plain >= PLAIN_RUN - 1, modes
    assert "\u2014" not in w.charts.plots["speedup"].titleLabel.item.toPlainText()
