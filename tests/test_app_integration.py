"""The real engine in the real window: tiny random models (fast) and the embedded pair (slow), greedy.

A full turn streams into the chat, Compare gives identical outputs off and on, and the exported CSV rows
equal the round events the engine actually yielded (recorded by a spy around Engine.generate).
"""
from __future__ import annotations

import csv
import os

import pytest
import torch

from app.window import MainWindow
from engine.engine import Controls
from engine.events import RoundEvent, Summary
from tests.app_fixtures import *  # noqa: F401,F403
from tests.app_fixtures import wait_idle


class Spy:
    """Records everything Engine.generate yields, in order, per request."""

    def __init__(self, engine) -> None:
        self.requests: list[list[RoundEvent | Summary]] = []
        original = engine.generate

        def generate(*args, **kwargs):
            seen: list[RoundEvent | Summary] = []
            self.requests.append(seen)
            for ev in original(*args, **kwargs):
                seen.append(ev)
                yield ev

        engine.generate = generate


def open_window(qtbot, qt_settings, make_host, engine, max_tokens: int, k: int = 4) -> MainWindow:
    w = MainWindow(make_host(engine, controls_factory=Controls), qt_settings)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    w.controls.temp_slider.setValue(0)  # greedy
    w.controls.max_tokens_spin.setValue(max_tokens)
    w.controls.k_slider.setValue(k)
    w.controls.spec_toggle.setChecked(True)
    return w


def full_turn_compare_and_export(qtbot, w: MainWindow, spy: Spy, prompt: str, tmp_path, timeout: int) -> None:
    w.input.setPlainText(prompt)
    w.send()
    wait_idle(qtbot, w, timeout=timeout)
    events = spy.requests[-1]
    summary = events[-1]
    assert isinstance(summary, Summary) and summary.new_tokens > 0
    # The chat shows exactly the engine's text, and the record holds every round it yielded.
    assert w.chat.reply_text() == summary.text
    assert w.conversation[-1] == {"role": "assistant", "content": summary.text}
    assert w.stats.records[-1].rounds == [e for e in events if isinstance(e, RoundEvent)]
    assert any(e.mode == "speculative" for e in events[:-1])

    dlg = w.compare()
    assert dlg is not None
    qtbot.waitUntil(lambda: dlg.verdict is not None, timeout=timeout)
    plain, spec = dlg.sides
    assert dlg.verdict.greedy and dlg.verdict.identical
    assert plain.summary.token_ids == spec.summary.token_ids == summary.token_ids
    assert {r.mode for r in plain.record.rounds} == {"plain"}
    qtbot.waitUntil(lambda: not w.host.busy, timeout=timeout)
    dlg.close()

    assert w.export_stats(str(tmp_path / "session.csv"))
    with open(tmp_path / "session.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    engine_rounds = [e for req in spy.requests for e in req if isinstance(e, RoundEvent)]
    assert len(rows) == len(engine_rounds)
    for row, ev in zip(rows, engine_rounds):
        assert int(row["round"]) == ev.round
        assert row["mode"] == ev.mode
        assert row["drafter"] == (ev.drafter or "")
        assert int(row["k"]) == ev.k
        assert float(row["temperature"]) == ev.temperature
        assert int(row["drafted"]) == len(ev.drafted)
        assert int(row["accepted"]) == ev.accepted
        assert int(row["committed"]) == len(ev.committed)
        assert int(row["final_token_id"]) == ev.committed[-1].token_id
        assert row["final_origin"] == ev.committed[-1].origin.value
        assert float(row["draft_ms"]) == pytest.approx(ev.draft_ms, abs=1e-3)
        assert float(row["verify_ms"]) == pytest.approx(ev.verify_ms, abs=1e-3)
    assert (tmp_path / "session_summary.csv").is_file()


def test_tiny_engine_in_the_real_window(qtbot, qt_settings, make_host, tmp_path):
    from tests.tiny import tiny_engine

    engine = tiny_engine()
    engine.eos_ids = set()  # run to the token limit so every side has the same length
    spy = Spy(engine)
    w = open_window(qtbot, qt_settings, make_host, engine, max_tokens=60)
    full_turn_compare_and_export(qtbot, w, spy, "hello there, how are you?", tmp_path, timeout=30_000)


@pytest.mark.embedded
def test_embedded_pair_in_the_real_window(qtbot, qt_settings, make_host, tmp_path):
    from engine.engine import Engine
    from engine.provision import default_pair

    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        target, draft = default_pair()
        engine = Engine.load(str(target), str(draft), device="cpu")
        spy = Spy(engine)
        w = open_window(qtbot, qt_settings, make_host, engine, max_tokens=24)
        full_turn_compare_and_export(qtbot, w, spy, "Write a Python function that reverses a string.", tmp_path,
                                     timeout=240_000)
        assert "def" in w.stats.records[0].summary.text
    finally:
        torch.set_num_threads(threads)
