"""The GUI thread never blocks for more than 50 ms while a reply streams (a 10 ms heartbeat measures it)."""
import time

import pytest
from PySide6.QtCore import QTimer

from app.window import MainWindow
from tests.app_fixtures import *  # noqa: F401,F403
from tests.app_fixtures import CODE_REPLY, FakeControls, FakeEngine, wait_idle

MAX_GAP_MS = 50.0


class Heartbeat:
    """A 10 ms GUI-thread timer; the largest gap between two ticks is how long the GUI thread was busy."""

    def __init__(self):
        self.ticks: list[float] = []
        self.timer = QTimer()
        self.timer.setInterval(10)
        self.timer.timeout.connect(lambda: self.ticks.append(time.perf_counter()))

    def start(self):
        self.timer.start()

    def stop(self):
        self.timer.stop()

    @property
    def max_gap_ms(self) -> float:
        return max((b - a) * 1000 for a, b in zip(self.ticks, self.ticks[1:]))


def run_with_heartbeat(qtbot, window, engine, prompt="Stream a long reply", timeout=60000):
    window.show()
    qtbot.waitExposed(window)
    beat = Heartbeat()
    window.input.setPlainText(prompt)
    window.send()
    qtbot.waitUntil(lambda: bool(window.record.rounds), timeout=timeout)  # past the prefill: now streaming
    beat.start()
    wait_idle(qtbot, window, timeout=timeout)
    beat.stop()
    print(f"heartbeat: {len(beat.ticks)} ticks, max gap {beat.max_gap_ms:.1f} ms")
    return beat


def test_heartbeat_with_scripted_engine(qtbot, qt_settings, make_host):
    # ~6 KB of text in rounds of ~3 ms, with real numpy work in the worker thread (GIL released, like torch).
    engine = FakeEngine(CODE_REPLY * 25, round_delay=0.002, work_ms=1.0)
    window = MainWindow(make_host(engine), qt_settings)
    qtbot.addWidget(window)
    window.controls.max_tokens_spin.setValue(8192)
    beat = run_with_heartbeat(qtbot, window, engine)
    rec = window.stats.records[-1]
    assert rec.summary.stop_reason == "eos" and len(rec.rounds) > 200
    assert len(beat.ticks) > 20
    assert beat.max_gap_ms < MAX_GAP_MS, f"GUI thread blocked for {beat.max_gap_ms:.1f} ms"
    assert window.charts.repaints > 3


def test_heartbeat_with_real_tiny_engine(qtbot, qt_settings, make_host):
    tiny = pytest.importorskip("tests.tiny")  # needs torch + transformers (always present in this project)
    engine = tiny.tiny_engine(max_seq_len=512)
    engine.eos_ids = set()  # a random model says EOS early: run to the length limit instead
    window = MainWindow(make_host(engine, controls_factory=_real_controls()), qt_settings)
    qtbot.addWidget(window)
    window.controls.max_tokens_spin.setValue(400)
    window.controls.temp_slider.setValue(80)
    beat = run_with_heartbeat(qtbot, window, engine, prompt="hello there")
    rec = window.stats.records[-1]
    assert rec.summary.stop_reason == "length" and rec.summary.new_tokens == 400
    assert sum(r.mode == "speculative" for r in rec.rounds) > 50
    assert beat.max_gap_ms < MAX_GAP_MS, f"GUI thread blocked for {beat.max_gap_ms:.1f} ms"


def _real_controls():
    from engine.engine import Controls

    return Controls


def test_fake_controls_match_the_engine(qapp):
    """The scripted engine's Controls stands in for the real one: same constructor and attributes."""
    from engine.config import SamplingParams, SpecParams

    Controls = _real_controls()
    real, fake = Controls(SamplingParams(), SpecParams()), FakeControls(SamplingParams(), SpecParams())
    assert set(vars(real)) == set(vars(fake))
    real.cancel()
    fake.cancel()
    assert real.cancelled and fake.cancelled
