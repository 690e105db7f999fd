"""The window attached to a server (app/remote_host.py, app/views/attach_mode.py): a recording of a real
llama-server replayed by a local test server (tests/remote_server.py), the local engine a scripted one."""
from __future__ import annotations

import csv
import json
import logging
import time

import pytest

from engine.api.config import APP_DEFAULTS
from engine.remote import metrics
from tests.app_fixtures import CODE_REPLY, wait_idle
from tests.remote_server import ReplayServer, recording

KEY = "sk-never-written-5d1e"


def attach(qtbot, window, url, plain=None, key=None):
    with qtbot.waitSignal(window.controller.loaded, timeout=10000):
        window.attach_mode.attach(url, plain, key)
    assert window.controller.remote is not None


def send(qtbot, window, text, timeout=10000):
    window.input.setPlainText(text)
    window.send()
    wait_idle(qtbot, window, timeout)


def test_attached_reply_is_coloured_and_its_totals_equal_the_servers_metrics(qtbot, window, tmp_path, dialogs):
    rec = recording("spec_code")
    with ReplayServer(rec) as srv:
        attach(qtbot, window, srv.url)
        model = rec["models"]["data"][0]["id"]  # llama-server names its model by the file's path
        assert model.rsplit("/", 1)[-1] + " + its draft model" in window.model_label.text()
        # a server with a draft: the local choice is kept (disabled while attached), not switched to n-gram
        assert window.controls.drafter_combo.currentData() == APP_DEFAULTS.drafter
        assert "llama.cpp" in window.model_label.text() and srv.url in window.model_label.text()
        send(qtbot, window, "Write fib")
    s = window.controller.stats.records[-1].summary
    assert s is not None and s.drafted > 0 and not dialogs
    d = metrics.parse(rec["metrics_after"], "llama.cpp").minus(metrics.parse(rec["metrics_before"], "llama.cpp"))
    # the exported CSV's drafted / accepted totals are the server's own counters
    window.export_stats(str(tmp_path / "stats.csv"))
    with open(tmp_path / "stats.csv", newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert sum(int(r["drafted"]) for r in rows) == d.draft_tokens
    assert sum(int(r["accepted"]) for r in rows) == d.accepted_tokens
    with open(tmp_path / "stats_summary.csv", newline="", encoding="utf-8") as f:
        summary = list(csv.DictReader(f))[-1]
    # where the reply came from: the server's model, its draft, its kind and URL
    assert (summary["target"], summary["draft"]) == ("qwen2.5-coder-1.5b-instruct.gguf", "its draft model")
    assert summary["engine"] == f"llama.cpp b0-unknown at {srv.url}"
    assert window.chat.reply_text() == s.text
    assert window.controller.conversation[-1] == {"role": "assistant", "content": s.text}
    assert len(window.charts.curves["tokens"].getData()[0]) == s.rounds


def test_what_a_server_cannot_do_is_disabled_with_a_reason(qtbot, window, dialogs):
    with ReplayServer(recording("spec_code")) as srv:
        attach(qtbot, window, srv.url)
        c = window.controls
        for w in (c.k_slider, c.drafter_combo, c.adaptive_check, c.stop_check, c.spec_toggle):
            assert not w.isEnabled() and "start-up flag" in w.toolTip() or "plain server" in w.toolTip()
        for action in (window.tune_action, window.stepper.toggle_action, window.rejected_action,
                       window.inspector.toggleViewAction()):
            assert not action.isEnabled() and action.toolTip()
        send(qtbot, window, "Write fib")
        assert not window.compare_action.isEnabled() and "plain server" in window.compare_action.toolTip()
        window.attach_mode.detach()
    # back to the local engine: the chat stays, the controls come back
    assert window.controller.remote is None and window.controller.ready
    assert window.controls.k_slider.isEnabled() and window.tune_action.isEnabled()
    assert window.controller.conversation[0]["content"] == "Write fib"
    send(qtbot, window, "again")
    assert window.chat.reply_text() == CODE_REPLY


def test_compare_runs_plain_on_the_plain_server(qtbot, window, dialogs):
    with ReplayServer(recording("spec_code")) as spec, ReplayServer(recording("nodraft_code")) as plain:
        attach(qtbot, window, spec.url, plain.url)
        assert window.controls.spec_toggle.isEnabled()
        send(qtbot, window, "Write fib")
        dlg = window.compare()
        qtbot.waitUntil(lambda: dlg.verdict is not None, timeout=15000)
        assert len(plain.requests) and any(p == "/v1/chat/completions" for p, _, _ in plain.requests)
        kinds = [r.kind for r in window.controller.stats.records]
        assert "compare-plain" in kinds and "compare-speculative" in kinds
        plain_rec = next(r for r in window.controller.stats.records if r.kind == "compare-plain")
        assert all(ev.mode == "plain" for ev in plain_rec.rounds)


def test_a_server_that_takes_speculation_per_request(qtbot, window, dialogs):
    """Asked at attach time (no plain server given): it honours "speculative.n_max", so K and on/off act on it and
    Compare runs its plain side on the same server."""
    with ReplayServer(recording("spec_code")) as srv:
        srv.script.off_lines = recording("nodraft_code")["lines"]
        attach(qtbot, window, srv.url)
        assert window.controller.remote.server.per_request_spec is True
        c = window.controls
        assert c.k_slider.isEnabled() and c.spec_toggle.isEnabled() and not c.drafter_combo.isEnabled()
        c.k_slider.setValue(3)
        send(qtbot, window, "Write fib")
        body = json.loads([b for p, _, b in srv.requests if p == "/v1/chat/completions"][-1])
        assert body["speculative.n_max"] == 3
        assert window.compare_action.isEnabled()
        dlg = window.compare()
        qtbot.waitUntil(lambda: dlg.verdict is not None, timeout=15000)
        plain_rec = next(r for r in window.controller.stats.records if r.kind == "compare-plain")
        assert all(ev.mode == "plain" and not ev.drafted for ev in plain_rec.rounds)
    assert not dialogs


def test_stop_mid_stream_within_a_second_and_errors_keep_the_chat(qtbot, window, dialogs):
    with ReplayServer(recording("spec_code")) as srv:
        attach(qtbot, window, srv.url)
        srv.script.stall_after = 12
        window.input.setPlainText("Write fib")
        window.send()
        qtbot.waitUntil(lambda: bool(window.controller.stats.records[-1].rounds), timeout=5000)
        t = time.monotonic()
        window.stop()
        qtbot.waitUntil(lambda: not window.controller.busy, timeout=2000)
        assert time.monotonic() - t < 1.0
        assert window.controller.stats.records[-1].summary.stop_reason == "cancelled"
        srv.script.stall_after = None
        srv.script.status = 500
        srv.script.error_body = '{"error": {"code": 500, "message": "the model crashed"}}'
        send(qtbot, window, "second")
    assert dialogs and "500 Internal Server Error: the model crashed" in dialogs[-1][2]
    assert [m["content"] for m in window.controller.conversation if m["role"] == "user"] == ["Write fib"]
    assert "Write fib" in window.chat.toPlainText()  # the stopped reply stays on screen with what arrived
    # a message that got nothing back is kept (on screen, or back in the message box)
    assert "second" in window.chat.toPlainText() + window.input.toPlainText()


def test_a_server_that_cannot_be_reached_leaves_the_local_engine(qtbot, window, dialogs):
    with ReplayServer() as srv:
        url = srv.url
    with qtbot.waitSignal(window.attach_mode.attachFailed, timeout=10000):
        window.attach_mode.attach(url)
    assert window.controller.remote is None and window.controller.ready
    assert "could not connect" in dialogs[-1][2] and "local engine stays in use" in dialogs[-1][2]


def test_connecting_to_a_silent_server_can_be_cancelled(qtbot, window, dialogs):
    """A server that accepts the connection and never answers: the status bar offers Cancel, which ends the
    connecting within the click, leaves the local engine in use, and shows no error."""
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)  # the kernel accepts connections for it; nothing ever reads or answers
    try:
        window.attach_mode.attach(f"http://127.0.0.1:{silent.getsockname()[1]}")
        cancel = window.attach_mode._cancel
        qtbot.waitUntil(lambda: cancel is not None and cancel.isVisible(), timeout=5000)
        remote = window.controller.connecting
        cancelled = []
        window.controller.attachCancelled.connect(lambda: cancelled.append(True))
        cancel.click()
        assert cancelled == [True]  # answered within the click, not when the silent server's probe gives up
        assert window.controller.connecting is None and window.controller.remote is None
        assert window.controller.ready and not cancel.isVisible() and dialogs == []
        assert "Stopped connecting" in window.statusBar().currentMessage()
        qtbot.waitUntil(lambda: not any(th.is_alive() for th in remote._threads), timeout=3000)  # the probe ended
    finally:
        silent.close()


def test_the_key_is_never_written(qtbot, window, tmp_path, caplog, qt_settings, dialogs):
    caplog.set_level(logging.DEBUG)
    with ReplayServer(recording("spec_code")) as srv:
        attach(qtbot, window, srv.url, key=KEY)
        send(qtbot, window, "Write fib")
        srv.script.status = 401
        srv.script.error_body = '{"error": {"message": "Invalid API Key"}}'
        send(qtbot, window, "again")
        assert all(h.get("Authorization") == f"Bearer {KEY}" for _, h, _ in srv.requests)
    window.export_stats(str(tmp_path / "stats.csv"))
    window.save_trace(str(tmp_path / "trace.json"))
    window.save_settings()
    written = [p for p in tmp_path.rglob("*") if p.is_file()]
    assert len(written) >= 3
    for p in written:
        assert KEY not in p.read_text(encoding="utf-8", errors="replace"), p
    assert KEY not in caplog.text
    assert qt_settings.value("attach/url") == srv.url


@pytest.mark.parametrize("argv_extra", [[]])
def test_attach_load_test_line(argv_extra, capfd):
    import subprocess
    import sys

    with ReplayServer(recording("spec_code")) as srv:
        out = subprocess.run([sys.executable, "-m", "app.main", "--attach", srv.url, "--load-test", *argv_extra],
                             capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    line = out.stdout.strip().splitlines()[-1]
    assert line.startswith("load-test ok: attached to llama.cpp") and srv.url in line and "draft model" in line
    bad = subprocess.run([sys.executable, "-m", "app.main", "--attach", srv.url, "--load-test"],
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and bad.stdout.strip().startswith("load-test failed: could not connect")
