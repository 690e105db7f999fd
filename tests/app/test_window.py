"""MainWindow end to end over the scripted engine: chat, stop, new chat, export, errors, keyboard."""
import csv
import os

import pytest
from PySide6.QtCore import Qt
from PySide6.QtTest import QTest

from engine.analysis.stats import ROUND_COLUMNS
from tests.app_fixtures import CODE_REPLY, LOAD_TIMEOUT_MS, fake, wait_idle


def send(qtbot, window, text):
    window.input.setPlainText(text)
    window.send()
    wait_idle(qtbot, window)


def test_reply_streams_and_is_recorded(qtbot, window):
    window.input.setPlainText("Write fib")
    window.send()
    assert window.controller.busy and not window.send_button.isEnabled() and window.stop_button.isEnabled()
    assert window.input.toPlainText() == ""
    wait_idle(qtbot, window)
    assert window.chat.reply_text() == CODE_REPLY
    assert "nope" in window.chat.toPlainText()  # the fake's rejected drafts, struck through
    window.rejected_action.setChecked(False)
    assert CODE_REPLY in window.chat.toPlainText()
    assert window.controller.conversation == [{"role": "user", "content": "Write fib"},
                                              {"role": "assistant", "content": CODE_REPLY}]
    rec = window.controller.stats.records[0]
    assert rec.summary is not None and len(rec.rounds) == rec.summary.rounds
    assert "reused 0 of" in window.chat.toPlainText()
    assert window.round_label.text().startswith("Done") and "tok/s" in window.round_label.text()
    assert window.send_button.isEnabled() and not window.stop_button.isEnabled()
    assert window.compare_action.isEnabled()
    assert len(window.charts.curves["tokens"].getData()[0]) == len(rec.rounds)


def test_follow_up_uses_history_system_prompt_and_shows_reuse(qtbot, window, engine_log):
    window.controls.system_edit.setPlainText("Be terse.")
    send(qtbot, window, "first")
    send(qtbot, window, "second")
    assert engine_log.requests[1] == [
        {"role": "system", "content": "Be terse."}, {"role": "user", "content": "first"},
        {"role": "assistant", "content": CODE_REPLY}, {"role": "user", "content": "second"},
    ]
    reused = window.controller.stats.records[1].summary.reused_prefix_tokens
    assert reused > 0
    assert window.reuse_label.text() == f"reused {reused} prompt tokens"
    assert window.controller.stats.summary_rows()[1]["reused_prefix_tokens"] == reused


def test_stop_button_and_escape_cancel_within_a_round(qtbot, make_window, engine_log):
    w = make_window(fake(round_delay=0.05, log=str(engine_log.path)))
    w.activateWindow()
    for how in ("button", "escape"):
        w.input.setPlainText("long one")
        w.send()
        record = w.controller.active.record
        qtbot.waitUntil(lambda: len(record.rounds) >= 2, timeout=5000)
        n = len(engine_log.seen)
        if how == "button":
            qtbot.mouseClick(w.stop_button, Qt.MouseButton.LeftButton)
        else:
            w.input.setFocus()
            QTest.keyClick(w.input, Qt.Key.Key_Escape)
        wait_idle(qtbot, w)
        assert len(engine_log.seen) <= n + 1, how
        assert record.summary.stop_reason == "cancelled", how
        assert "stopped" in w.chat.toPlainText()
        assert len(w.chat.reply_text()) < len(CODE_REPLY)


def test_enter_sends_shift_enter_newline(qtbot, window):
    window.input.setFocus()
    QTest.keyClicks(window.input, "line one")
    QTest.keyClick(window.input, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    QTest.keyClicks(window.input, "line two")
    assert window.input.toPlainText() == "line one\nline two" and not window.controller.busy
    QTest.keyClick(window.input, Qt.Key.Key_Return)
    assert window.controller.busy
    wait_idle(qtbot, window)
    assert window.controller.conversation[0]["content"] == "line one\nline two"


def test_new_chat_clears_and_resets_engine(qtbot, window, engine_log):
    send(qtbot, window, "hello")
    window.new_chat()
    qtbot.waitUntil(lambda: engine_log.resets == 1, timeout=5000)
    assert window.controller.conversation == [] and window.chat.turns == [] and window.chat.toPlainText() == ""
    assert window.charts.buffer.x == []
    assert not window.compare_action.isEnabled()
    send(qtbot, window, "again")
    assert engine_log.requests[-1] == [{"role": "user", "content": "again"}]
    assert [r.chat for r in window.controller.stats.records] == [1, 2]  # the session's stats survive New chat


def test_new_chat_while_generating(qtbot, make_window, engine_log):
    w = make_window(fake(round_delay=0.03, log=str(engine_log.path)), show=False)
    w.input.setPlainText("hi")
    w.send()
    qtbot.waitUntil(lambda: len(engine_log.seen) >= 2, timeout=5000)
    w.new_chat()
    qtbot.waitUntil(lambda: not w.controller.busy and engine_log.resets == 1, timeout=5000)
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
    records = window.controller.stats.records
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
    assert len(window.controller.stats.records) == 1 and window.chat.reply_text() == CODE_REPLY


def test_bad_model_path_shows_error_and_keeps_everything(qtbot, make_window, dialogs):
    w = make_window(show=False)  # fake_loader: the default pair loads, a named path does not exist
    pid = w.controller.host.pid
    send(qtbot, w, "keep me")
    w.load_models("/does/not/exist")
    assert w.load_dialog is not None and not w.controls.load_button.isEnabled()
    qtbot.waitUntil(lambda: bool(dialogs), timeout=5000)
    assert dialogs[-1] == ("critical", "Could not load the model",
                           "/does/not/exist: no config.json, *.safetensors or .gguf found")
    assert w.load_dialog is None and w.controls.load_button.isEnabled()
    assert w.controller.ready and w.controller.host.pid == pid  # the same engine, in the same process
    assert w.chat.reply_text() == CODE_REPLY and len(w.controller.stats.records) == 1
    send(qtbot, w, "still works")
    assert len(w.controller.stats.records) == 2


def test_engine_error_shows_dialog_and_keeps_chat(qtbot, make_window, dialogs):
    w = make_window(fake(fail_at_round=4, fail_requests=1), show=False)  # only the first request fails
    send(qtbot, w, "boom")
    assert dialogs == [("critical", "Generation failed", "RuntimeError: scripted engine failure")]
    partial = w.chat.reply_text()
    assert partial and "failed: RuntimeError" in w.chat.toPlainText()
    assert w.controller.conversation[-1] == {"role": "assistant", "content": partial}
    assert w.send_button.isEnabled()
    send(qtbot, w, "again")
    assert w.controller.stats.records[-1].summary is not None


def test_load_progress_dialog_and_success(qtbot, make_window, tmp_path):
    gate = tmp_path / "gate"
    w = make_window(fake(gate=str(gate), draft_name=None), load=False, show=False)
    assert not w.send_button.isEnabled()
    w.load_models(None)
    qtbot.waitUntil(lambda: w.load_dialog is not None and w.load_dialog.labelText() == "Converting target",
                    timeout=LOAD_TIMEOUT_MS)
    assert w.load_dialog.value() == 250
    gate.touch()
    qtbot.waitUntil(lambda: w.controller.ready, timeout=5000)
    qtbot.waitUntil(lambda: w.load_dialog is None, timeout=5000)
    assert "fake-target" in w.model_label.text() and w.send_button.isEnabled()
    assert w.controls.spec_params().drafter == "ngram"  # no draft model in this pair


def test_cancel_load_from_dialog(qtbot, make_window, tmp_path):
    gate = tmp_path / "gate"
    w = make_window(fake(gate=str(gate)), load=False, show=False)
    w.load_models(None)
    qtbot.waitUntil(lambda: w.load_dialog.labelText() == "Converting target", timeout=LOAD_TIMEOUT_MS)
    from PySide6.QtWidgets import QPushButton

    qtbot.mouseClick(w.load_dialog.findChild(QPushButton), Qt.MouseButton.LeftButton)  # its Cancel button
    qtbot.wait(100)  # the cancel reaches the engine process before the gate opens
    gate.touch()
    qtbot.waitUntil(lambda: w.load_dialog is None, timeout=5000)
    assert not w.controller.ready and "cancelled" in w.statusBar().currentMessage()


def test_menus_and_shortcuts(window):
    titles = [a.text() for a in window.menuBar().actions()]
    assert titles == ["&File", "&Model", "&Run", "&View", "&Help"]
    assert window.new_action.shortcut().toString() == "Ctrl+N"
    assert window.quit_action.shortcut().toString() == "Ctrl+Q"
    assert window.stop_action.shortcut().toString() == "Esc"
    assert window.rejected_action.isCheckable()
    window.rejected_action.setChecked(False)
    assert not window.chat.show_rejected


def test_theme_switch_recolours(qtbot, window):
    from app.views.theme import is_dark

    window.set_theme("dark")
    qtbot.waitUntil(lambda: is_dark(window.chat.palette()) and window.chat._colours.dark, timeout=2000)
    window.set_theme("light")
    qtbot.waitUntil(lambda: not is_dark(window.chat.palette()) and not window.chat._colours.dark, timeout=2000)


def test_message_waits_while_no_model_is_ready(qtbot, make_window, tmp_path):
    gate = tmp_path / "gate"
    w = make_window(fake(gate=str(gate)), load=False, show=False)
    w.input.setPlainText("keep me")
    w.send()
    assert w.input.toPlainText() == "keep me" and "No model is loaded" in w.statusBar().currentMessage()
    w.load_models(None)
    w.send()
    assert w.input.toPlainText() == "keep me" and "still loading" in w.statusBar().currentMessage()
    gate.touch()
    qtbot.waitUntil(lambda: w.controller.ready, timeout=LOAD_TIMEOUT_MS)
    w.send()
    wait_idle(qtbot, w)
    assert w.input.toPlainText() == "" and w.chat.reply_text() == CODE_REPLY


def test_a_lone_surrogate_is_replaced_and_the_reply_runs(qtbot, window, engine_log):
    """The engine refuses text that is not valid Unicode; the app sends U+FFFD in its place."""
    c = window.controller
    text = "a" + chr(0xD800) + "b"
    assert c.send(text, window.controls.sampling_params(), window.controls.spec_params(), "sys" + chr(0xDC00))
    wait_idle(qtbot, window)
    assert engine_log.requests[0] == [{"role": "system", "content": "sys\ufffd"},
                                      {"role": "user", "content": "a\ufffdb"}]
    assert c.conversation[0] == {"role": "user", "content": "a\ufffdb"}
    assert c.stats.records[0].summary is not None


def test_a_message_too_long_for_the_context_is_not_sent_and_says_so(qtbot, make_window, dialogs):
    """The error named a Python class, and the refused message stayed in the chat as if sent."""
    from tests.app_fixtures import tiny

    w = make_window(tiny(max_seq_len=64), show=False)
    send(qtbot, w, "hi")
    before = (w.chat.toPlainText(), list(w.controller.conversation))
    long = "x" * 200  # one token a character: far past 64
    send(qtbot, w, long)
    ((kind, title, text),) = dialogs
    assert (kind, title) == ("critical", "Message not sent")
    assert "Error" not in text and "does not fit" in text and "64" in text and "new chat" in text
    assert "back in the message box" in text
    assert w.input.toPlainText() == long
    assert (w.chat.toPlainText(), w.controller.conversation) == before
    assert w.send_button.isEnabled()


def test_a_refused_target_stays_in_the_picker(qtbot, make_window, dialogs):
    """After a refused --target the Target combo showed the embedded pair, as if that was asked."""
    w = make_window(show=False)  # fake_loader: the default pair loads, a named path does not exist
    w.load_models("/does/not/exist")
    qtbot.waitUntil(lambda: bool(dialogs), timeout=5000)
    assert w.controls.target_combo.currentData() == "/does/not/exist"
    assert "exist" in w.controls.target_combo.currentText()
    w.controls.set_local_models([])  # a rescan keeps it
    assert w.controls.target_combo.currentData() == "/does/not/exist"
    w.load_models(None)
    qtbot.waitUntil(lambda: w.controller.ready and w.load_dialog is None, timeout=LOAD_TIMEOUT_MS)
    assert w.controls.target_combo.currentData() is None  # the embedded pair, loaded


def test_the_context_setting_reaches_the_engine_at_the_next_load(qtbot, make_window):
    """The window's context setting sizes the engine's caches when the models load."""
    from tests.app_fixtures import tiny

    w = make_window(tiny(max_seq_len=256), show=False)
    assert w.controller.info.context == 256  # what the engine reports, shown beside the models
    assert "context 256 tokens" in w.model_label.text()
    w.controls.context.spin.setValue(512)  # the tiny pair's limit; the scan knows nothing of it here
    assert w.controls.context_tokens() == 512
    assert w.controller.info.context == 256  # nothing changes before the next load
    w.load_models(None)
    qtbot.waitUntil(lambda: w.controller.ready and w.load_dialog is None and w.controller.info.context == 512,
                    timeout=LOAD_TIMEOUT_MS)
    assert "context 512 tokens" in w.model_label.text()


def test_a_gguf_file_can_be_opened_from_the_file_menu(window, monkeypatch):
    """The folder picker cannot select a .gguf, which every other entry accepts; File has a file picker for it."""
    from PySide6.QtWidgets import QFileDialog

    asked, loaded = [], []
    monkeypatch.setattr(QFileDialog, "getOpenFileName",
                        staticmethod(lambda *a: asked.append(a[3]) or ("/models/qwen3-0.6b-q4_k_m.gguf", "")))
    monkeypatch.setattr(window.model_loading, "load_models", lambda target, draft: loaded.append((target, draft)))
    window.menus.open_file_action.trigger()
    assert asked and "*.gguf" in asked[0]
    assert loaded == [("/models/qwen3-0.6b-q4_k_m.gguf", None)]
    assert window.menus.open_file_action in window.menuBar().actions()[0].menu().actions()


def test_the_final_status_sums_up_the_reply_not_its_last_round(qtbot, window):
    """After a reply the status line gives the reply's rounds, tokens a round, rate and acceptance (scoped to
    this reply), not the last round's K or mode."""
    window.input.setPlainText("hello")
    window.send()
    wait_idle(qtbot, window)
    s = window.controller.stats.records[-1].summary
    text = window.round_label.text()
    assert text.startswith(f"Done \u00b7 {s.rounds} rounds \u00b7 {s.mean_tokens_per_round:.2f} tokens a round")
    assert f"{s.tokens_per_s:.1f} tok/s" in text and text.endswith("(this reply)") and "K " not in text
