"""MainWindow end to end over the scripted engine: chat, stop, new chat, export, errors, keyboard."""
import csv
import os

import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest

from app.window import MainWindow
from engine.stats import ROUND_COLUMNS
from tests.app_fixtures import *  # noqa: F401,F403
from tests.app_fixtures import CODE_REPLY, FakeEngine, wait_idle


def send(qtbot, window, text):
    window.input.setPlainText(text)
    window.send()
    wait_idle(qtbot, window)


def test_reply_streams_and_is_recorded(qtbot, window, fake_engine):
    window.input.setPlainText("Write fib")
    window.send()
    assert window.host.busy and not window.send_button.isEnabled() and window.stop_button.isEnabled()
    assert window.input.toPlainText() == ""
    wait_idle(qtbot, window)
    assert window.chat.reply_text() == CODE_REPLY
    assert "nope" in window.chat.toPlainText()  # the fake's rejected drafts, struck through
    window.rejected_action.setChecked(False)
    assert CODE_REPLY in window.chat.toPlainText()
    assert window.conversation == [{"role": "user", "content": "Write fib"},
                                   {"role": "assistant", "content": CODE_REPLY}]
    rec = window.stats.records[0]
    assert rec.summary is not None and len(rec.rounds) == rec.summary.rounds
    assert "reused 0 of" in window.chat.toPlainText()
    assert window.round_label.text().startswith("Done") and "tok/s" in window.round_label.text()
    assert window.send_button.isEnabled() and not window.stop_button.isEnabled()
    assert window.compare_action.isEnabled()
    assert len(window.charts.curves["tokens"].getData()[0]) == len(rec.rounds)


def test_follow_up_uses_history_system_prompt_and_shows_reuse(qtbot, window, fake_engine):
    window.controls.system_edit.setPlainText("Be terse.")
    send(qtbot, window, "first")
    send(qtbot, window, "second")
    assert fake_engine.requests[1] == [
        {"role": "system", "content": "Be terse."}, {"role": "user", "content": "first"},
        {"role": "assistant", "content": CODE_REPLY}, {"role": "user", "content": "second"},
    ]
    reused = window.stats.records[1].summary.reused_prefix_tokens
    assert reused > 0
    assert window.reuse_label.text() == f"reused {reused} prompt tokens"
    assert window.stats.summary_rows()[1]["reused_prefix_tokens"] == reused


def test_stop_button_and_escape_cancel_within_a_round(qtbot, qt_settings, make_host):
    engine = FakeEngine(round_delay=0.05)
    w = MainWindow(make_host(engine), qt_settings)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    w.activateWindow()
    for how in ("button", "escape"):
        w.input.setPlainText("long one")
        w.send()
        qtbot.waitUntil(lambda: len(w.record.rounds) >= 2, timeout=5000)
        n = len(engine.seen)
        if how == "button":
            qtbot.mouseClick(w.stop_button, Qt.MouseButton.LeftButton)
        else:
            w.input.setFocus()
            QTest.keyClick(w.input, Qt.Key.Key_Escape)
        wait_idle(qtbot, w)
        assert len(engine.seen) <= n + 1, how
        assert w.record.summary.stop_reason == "cancelled", how
        assert "stopped" in w.chat.toPlainText()
        assert len(w.chat.reply_text()) < len(CODE_REPLY)


def test_enter_sends_shift_enter_newline(qtbot, window):
    window.input.setFocus()
    QTest.keyClicks(window.input, "line one")
    QTest.keyClick(window.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    QTest.keyClicks(window.input, "line two")
    assert window.input.toPlainText() == "line one\nline two" and not window.host.busy
    QTest.keyClick(window.input, Qt.Key.Key_Return)
    assert window.host.busy
    wait_idle(qtbot, window)
    assert window.conversation[0]["content"] == "line one\nline two"


def test_new_chat_clears_and_resets_engine(qtbot, window, fake_engine):
    send(qtbot, window, "hello")
    window.new_chat()
    qtbot.waitUntil(lambda: fake_engine.resets == 1, timeout=5000)
    assert window.conversation == [] and window.chat.turns == [] and window.chat.toPlainText() == ""
    assert window.charts.buffer.x == []
    assert not window.compare_action.isEnabled()
    send(qtbot, window, "again")
    assert fake_engine.requests[-1] == [{"role": "user", "content": "again"}]
    assert [r.chat for r in window.stats.records] == [1, 2]  # the session's stats survive New chat


def test_new_chat_while_generating(qtbot, qt_settings, make_host):
    engine = FakeEngine(round_delay=0.03)
    w = MainWindow(make_host(engine), qt_settings)
    qtbot.addWidget(w)
    w.input.setPlainText("hi")
    w.send()
    qtbot.waitUntil(lambda: len(engine.seen) >= 2, timeout=5000)
    w.new_chat()
    qtbot.waitUntil(lambda: not w.host.busy and engine.resets == 1, timeout=5000)
    w.repaint_frame()
    assert w.chat.toPlainText() == ""  # late rounds of the old reply are dropped


def test_export_csv_matches_session(qtbot, window, tmp_path):
    send(qtbot, window, "one")
    window.controls.spec_toggle.setChecked(False)
    send(qtbot, window, "two")
    path = tmp_path / "stats.csv"
    assert window.export_stats(str(path))
    with path.open(newline="") as f:
        rows = list(csv.DictReader(f))
    records = window.stats.records
    assert len(rows) == sum(len(r.rounds) for r in records)
    assert list(rows[0]) == list(ROUND_COLUMNS)
    flat = [(rec, ev) for rec in records for ev in rec.rounds]
    for row, (rec, ev) in zip(rows, flat):
        assert int(row["message"]) == rec.message and int(row["round"]) == ev.round
        assert row["mode"] == ev.mode and int(row["k"]) == ev.k and int(row["drafted"]) == len(ev.drafted)
        assert int(row["accepted"]) == ev.accepted and float(row["temperature"]) == ev.temperature
        assert row["final_token"] == ev.committed[-1].text and row["final_origin"] == ev.committed[-1].origin.value
        assert float(row["draft_ms"]) == pytest.approx(ev.draft_ms, abs=1e-3)
    assert {r["mode"] for r in rows if r["message"] == "2"} == {"plain"}
    with (tmp_path / "stats_summary.csv").open(newline="") as f:
        summary = list(csv.DictReader(f))
    assert [s["prompt"] for s in summary] == ["one", "two"]
    assert summary[0]["new_tokens"] == str(records[0].summary.new_tokens)
    assert "stats.csv" in window.statusBar().currentMessage()


def test_export_via_dialog_and_shortcut(qtbot, window, tmp_path, monkeypatch):
    from PySide6.QtWidgets import QFileDialog

    send(qtbot, window, "one")
    target = tmp_path / "picked.csv"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a, **k: (str(target), "")))
    assert window.export_action.shortcut().toString() == "Ctrl+E"
    window.export_action.trigger()
    assert target.exists() and (tmp_path / "picked_summary.csv").exists()


def test_unwritable_export_shows_error_and_keeps_session(qtbot, window, tmp_path, dialogs):
    send(qtbot, window, "one")
    bad = tmp_path / "no-such-dir" / "x.csv"
    if os.name != "nt":
        assert not window.export_stats(str(bad))
    kind, title, text = dialogs[-1]
    assert kind == "critical" and title == "Could not export the session stats"
    assert str(bad) in text and "session is kept" in text
    assert len(window.stats.records) == 1 and window.chat.reply_text() == CODE_REPLY


def test_bad_model_path_shows_error_and_keeps_everything(qtbot, qt_settings, make_host, dialogs):
    class ModelLoadError(Exception):
        pass

    def loader(target, *_):
        raise ModelLoadError(f"{target}: no config.json, *.safetensors or .gguf found")

    engine = FakeEngine()
    w = MainWindow(make_host(engine, loader=loader), qt_settings)
    qtbot.addWidget(w)
    send(qtbot, w, "keep me")
    w.load_models("/does/not/exist")
    assert w.load_dialog is not None and not w.controls.load_button.isEnabled()
    qtbot.waitUntil(lambda: bool(dialogs), timeout=5000)
    assert dialogs[-1] == ("critical", "Could not load the model",
                           "/does/not/exist: no config.json, *.safetensors or .gguf found")
    assert w.load_dialog is None and w.controls.load_button.isEnabled()
    assert w.host.ready and w.host.worker.engine is engine
    assert w.chat.reply_text() == CODE_REPLY and len(w.stats.records) == 1
    send(qtbot, w, "still works")
    assert len(w.stats.records) == 2


def test_engine_error_shows_dialog_and_keeps_chat(qtbot, qt_settings, make_host, dialogs):
    engine = FakeEngine(fail_at_round=4)
    w = MainWindow(make_host(engine), qt_settings)
    qtbot.addWidget(w)
    send(qtbot, w, "boom")
    assert dialogs == [("critical", "Generation failed", "RuntimeError: scripted engine failure")]
    partial = w.chat.reply_text()
    assert partial and "failed: RuntimeError" in w.chat.toPlainText()
    assert w.conversation[-1] == {"role": "assistant", "content": partial}
    assert w.send_button.isEnabled()
    engine.fail_at_round = None
    send(qtbot, w, "again")
    assert w.stats.records[-1].summary is not None


def test_load_progress_dialog_and_success(qtbot, qt_settings, make_host):
    import threading

    gate = threading.Event()
    engine = FakeEngine(draft_name=None)

    def loader(target, draft, device, progress, cancelled):
        progress("Converting target", 0.25)
        gate.wait(5)
        progress("Loading weights", 1.0)
        return engine

    w = MainWindow(make_host(None, loader=loader), qt_settings)
    qtbot.addWidget(w)
    assert not w.send_button.isEnabled()
    w.load_models(None)
    qtbot.waitUntil(lambda: w.load_dialog is not None and w.load_dialog.labelText() == "Converting target",
                    timeout=5000)
    assert w.load_dialog.value() == 250
    gate.set()
    qtbot.waitUntil(lambda: w.host.ready, timeout=5000)
    qtbot.waitUntil(lambda: w.load_dialog is None, timeout=5000)
    assert "fake-target" in w.model_label.text() and w.send_button.isEnabled()
    assert w.controls.spec_params().drafter == "ngram"  # no draft model in this pair


def test_cancel_load_from_dialog(qtbot, qt_settings, make_host):
    import threading

    gate = threading.Event()

    def loader(target, draft, device, progress, cancelled):
        gate.wait(5)
        if cancelled():
            raise RuntimeError("cancelled")
        return FakeEngine()

    w = MainWindow(make_host(None, loader=loader), qt_settings)
    qtbot.addWidget(w)
    w.load_models(None)
    from PySide6.QtWidgets import QPushButton

    qtbot.mouseClick(w.load_dialog.findChild(QPushButton), Qt.MouseButton.LeftButton)  # its Cancel button
    gate.set()
    qtbot.waitUntil(lambda: w.load_dialog is None, timeout=5000)
    assert not w.host.ready and "cancelled" in w.statusBar().currentMessage()


def test_menus_and_shortcuts(window):
    titles = [a.text() for a in window.menuBar().actions()]
    assert titles == ["&File", "&Run", "&View", "&Help"]
    assert window.new_action.shortcut().toString() == "Ctrl+N"
    assert window.quit_action.shortcut().toString() == "Ctrl+Q"
    assert window.stop_action.shortcut().toString() == "Esc"
    assert window.rejected_action.isCheckable()
    window.rejected_action.setChecked(False)
    assert not window.chat.show_rejected


def test_theme_switch_recolours(qtbot, window):
    from app.theme import is_dark

    window.set_theme("dark")
    qtbot.waitUntil(lambda: is_dark(window.chat.palette()) and window.chat._colours.dark, timeout=2000)
    window.set_theme("light")
    qtbot.waitUntil(lambda: not is_dark(window.chat.palette()) and not window.chat._colours.dark, timeout=2000)
