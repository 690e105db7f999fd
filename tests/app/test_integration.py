"""The real engine in the real window: tiny random models (fast) and the embedded pair (slow), greedy.

The engine runs in its own process, as in the app. A full turn streams into the chat, Compare gives identical
outputs off and on, and the exported CSV rows equal the round events the engine actually yielded (recorded in
the engine process by a spy around Engine.generate, and read back here).
"""
from __future__ import annotations

import csv

import pytest

from app.views.window import MainWindow
from engine.api.events import RoundEvent, Summary
from engine.service.loaders import DEFAULT_LOADER
from tests.app_fixtures import spied, spy, tiny, wait_idle


def open_window(make_window, loader, max_tokens: int, k: int = 4, **kw) -> MainWindow:
    w = make_window(loader, **kw)
    w.controls.temp_slider.setValue(0)  # greedy
    w.controls.max_tokens_spin.setValue(max_tokens)
    w.controls.k_slider.setValue(k)
    w.controls.spec_toggle.setChecked(True)
    return w


def full_turn_compare_and_export(qtbot, w: MainWindow, spy_path, prompt: str, tmp_path, timeout: int) -> None:
    w.input.setPlainText(prompt)
    w.send()
    wait_idle(qtbot, w, timeout=timeout)
    qtbot.waitUntil(lambda: len(spied(spy_path)) == 1, timeout=5000)  # written as the generator closes
    events = spied(spy_path)[-1]
    summary = events[-1]
    assert isinstance(summary, Summary) and summary.new_tokens > 0
    # The chat shows exactly the engine's text, and the record holds every round it yielded.
    assert w.chat.reply_text() == summary.text
    assert w.controller.conversation[-1] == {"role": "assistant", "content": summary.text}
    assert w.controller.stats.records[-1].rounds == [e for e in events if isinstance(e, RoundEvent)]
    assert any(e.mode == "speculative" for e in events[:-1])

    dlg = w.compare()
    assert dlg is not None
    qtbot.waitUntil(lambda: dlg.verdict is not None, timeout=timeout)
    plain, spec = dlg.sides
    assert dlg.verdict.greedy and dlg.verdict.identical
    assert plain.summary.token_ids == spec.summary.token_ids == summary.token_ids
    assert {r.mode for r in plain.record.rounds} == {"plain"}
    qtbot.waitUntil(lambda: not w.controller.busy, timeout=timeout)
    dlg.close()

    assert w.export_stats(str(tmp_path / "session.csv"))
    with open(tmp_path / "session.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    qtbot.waitUntil(lambda: len(spied(spy_path)) == 3, timeout=5000)
    engine_rounds = [e for req in spied(spy_path) for e in req if isinstance(e, RoundEvent)]
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


def test_tiny_engine_in_the_real_window(qtbot, make_window, tmp_path):
    path = tmp_path / "spy.pickle"
    w = open_window(make_window, spy(tiny(), path), max_tokens=60)
    full_turn_compare_and_export(qtbot, w, path, "hello there, how are you?", tmp_path, timeout=30_000)


@pytest.mark.embedded
def test_embedded_pair_in_the_real_window(qtbot, make_window, tmp_path):
    path = tmp_path / "spy.pickle"
    w = open_window(make_window, spy(DEFAULT_LOADER, path), max_tokens=24, load_timeout_ms=600_000)
    full_turn_compare_and_export(qtbot, w, path, "Write a Python function that reverses a string.", tmp_path,
                                 timeout=240_000)
    assert "def" in w.controller.stats.records[0].summary.text
