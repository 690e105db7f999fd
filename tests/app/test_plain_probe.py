"""A chat reply's plain steps: the measured speedup's basis, timed in the same minutes as the reply."""
from app.session.plain_probe import PlainProbes
from engine.api.config import SpecParams
from engine.api.events import Origin
from tests.app_fixtures import CODE_REPLY, fake, make_round, wait_idle


def spec_round(i: int):
    return make_round(i, ("a",), ("x",), "d", k=4)


def plain_round(i: int):
    return make_round(i, (), (), "p", Origin.PLAIN, mode="plain", drafter=None, draft_ms=0.0)


def test_one_plain_step_every_so_many_rounds():
    probes = PlainProbes(SpecParams(k=4))
    assert probes.after([spec_round(i) for i in (1, 2, 3)]) is False
    assert probes.after([spec_round(4)]) is True and probes.out  # ask for one plain round
    assert probes.after([spec_round(5)]) is False  # the ask is on its way: not asked twice
    assert probes.after([plain_round(6)]) is False and not probes.out and probes.probes == 1
    later = [spec_round(i) for i in range(7, 7 + PlainProbes.EVERY - 1)]
    assert probes.after(later) is False  # the next one EVERY rounds after the plain step
    assert probes.after([spec_round(6 + PlainProbes.EVERY)]) is True


def test_with_speculation_turned_off_nothing_is_asked_and_a_probe_still_ends():
    probes = PlainProbes(SpecParams(k=4))
    assert probes.after([spec_round(i) for i in range(1, 5)]) and probes.out
    probes.set_user(SpecParams(enabled=False))
    assert probes.after([plain_round(5)]) is False and not probes.out and probes.probes == 1
    assert probes.after([plain_round(i) for i in range(6, 40)]) is False  # speculation off: nothing to probe
    probes.set_user(SpecParams(k=6, drafter="ngram"))
    assert probes.after([spec_round(40)]) is True


def test_no_new_probe_while_stepping_nor_after_the_last_round():
    probes = PlainProbes(SpecParams(k=4))
    assert probes.after([spec_round(i) for i in range(1, 9)], may_start=False) is False and not probes.out
    last = make_round(9, ("a",), ("x",), "d", k=4)
    last = type(last)(**{**last.__dict__, "stop_reason": "eos"})
    assert probes.after([last]) is False and not probes.out


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
    assert first >= PlainProbes.FIRST - 1 and "speculative" in modes[first:], modes
    assert "plain" not in {modes[i + 1] for i, m in enumerate(modes[:-1]) if m == "plain"}, modes  # one at a time
    assert "".join(ev.text_delta for ev in rounds) == CODE_REPLY
    b = w.charts.buffer
    assert b.plain_ms is not None and b.reply.step_passes == modes.count("plain")
    assert b.reply.measured_speedup() is not None
    assert "\u2014" not in w.charts.plots["speedup"].titleLabel.item.toPlainText()
