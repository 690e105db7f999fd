"""The engine process dies mid-reply (SIGKILL, as the kernel's OOM killer does): the window stays up, says what
happened in one sentence, keeps the chat, the charts and the session stats, and after "Reload models" the next
message works. Tiny real models run in the engine process."""
import csv
import os
import signal

from PySide6.QtCore import Qt

from tests.app_fixtures import LOAD_TIMEOUT_MS, tiny, wait_idle

KILLED = ("The engine process was killed (SIGKILL). The system sends it when memory runs out; "
          "check free memory before reloading.")


def send(qtbot, w, text, max_tokens):
    w.controls.max_tokens_spin.setValue(max_tokens)
    w.input.setPlainText(text)
    w.send()


def test_sigkill_mid_reply_then_reload(qtbot, make_window, dialogs, tmp_path):
    w = make_window(tiny(round_delay=0.02))
    c = w.controller
    send(qtbot, w, "first", 24)
    wait_idle(qtbot, w, timeout=30_000)
    first = c.stats.records[0]
    assert first.summary is not None and w.chat.reply_text() == first.summary.text

    send(qtbot, w, "second", 400)
    second = c.active.record
    qtbot.waitUntil(lambda: len(second.rounds) >= 3, timeout=10_000)
    pid = c.host.pid
    os.kill(pid, signal.SIGKILL)
    qtbot.waitUntil(lambda: w.banner.isVisible(), timeout=10_000)
    wait_idle(qtbot, w)

    # The window is up and says what happened, once, without a modal dialog.
    assert w.isVisible() and dialogs == []
    assert KILLED in w.banner.label.text() and w.banner.reload_button.isEnabled()
    assert w.statusBar().currentMessage() == KILLED
    assert not c.ready and not c.busy and not w.send_button.isEnabled()
    # The chat keeps both turns; the second reply is marked interrupted and keeps what arrived.
    partial = "".join(ev.text_delta for ev in second.rounds)
    assert partial and w.chat.reply_text(0) == first.summary.text and w.chat.reply_text(1) == partial
    assert "interrupted" in w.chat.toPlainText()
    assert c.conversation == [{"role": "user", "content": "first"},
                              {"role": "assistant", "content": first.summary.text},
                              {"role": "user", "content": "second"},
                              {"role": "assistant", "content": partial}]
    # The session stats and the charts keep every round.
    assert [r.summary is None for r in c.stats.records] == [False, True]
    assert len(w.charts.buffer.x) == len(first.rounds) + len(second.rounds)
    assert w.export_stats(str(tmp_path / "s.csv"))
    with open(tmp_path / "s_summary.csv", newline="") as f:
        assert [row["stop_reason"] for row in csv.DictReader(f)] == ["length", "error"]
    # A message typed now is kept, with a word on why it cannot go yet.
    w.input.setPlainText("third")
    w.send()
    assert w.input.toPlainText() == "third" and "reload" in w.statusBar().currentMessage().lower()

    qtbot.mouseClick(w.banner.reload_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: c.ready, timeout=LOAD_TIMEOUT_MS)
    qtbot.waitUntil(lambda: w.load_dialog is None, timeout=5000)
    assert c.host.pid != pid and not w.banner.isVisible() and w.send_button.isEnabled()
    w.controls.max_tokens_spin.setValue(24)
    w.send()
    wait_idle(qtbot, w, timeout=30_000)
    third = c.stats.records[-1]
    assert third.summary is not None and third.summary.new_tokens == 24
    assert w.chat.reply_text(2) == third.summary.text and c.conversation[-1]["content"] == third.summary.text
    assert dialogs == []


def test_engine_dying_while_idle_is_reported(qtbot, make_window, dialogs):
    from tests.app_fixtures import fake

    w = make_window(fake())
    os.kill(w.controller.host.pid, signal.SIGTERM)
    qtbot.waitUntil(lambda: w.banner.isVisible(), timeout=10_000)
    assert "stopped by SIGTERM" in w.banner.label.text() and dialogs == []
    assert w.model_label.text() == "Engine stopped"
