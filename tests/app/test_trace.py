"""Session traces: save, reopen to the same view, refuse damaged or foreign files clearly, open from the command line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.session.trace import (
    FORMAT,
    VERSION,
    Settings,
    Trace,
    TraceError,
    from_json,
    read_trace,
    to_json,
    write_trace,
)
from engine.analysis.stats import MessageRecord
from engine.api.config import SamplingParams, SpecParams
from engine.api.dists import PositionDist
from engine.api.events import Origin
from engine.api.protocol import EngineInfo
from tests.app_fixtures import make_round, make_summary, tiny, wait_idle

ROOT = Path(__file__).resolve().parents[2]


def hand_made_trace() -> Trace:
    """Two chat replies (the second in a new chat) and a Compare replay, with inspector rows."""
    from dataclasses import replace

    row = PositionDist(ids=(100, 7), texts=("Hello", "x"), p=(0.8, 0.1), q=(0.5, 0.3), u=0.25, tv=0.3)
    rej = PositionDist(ids=(300, 200), texts=(" world", " nope"), p=(0.42, 0.15), q=(0.1, 0.6), u=0.9, tv=0.5,
                       residual_ids=(300,), residual_texts=(" world",), residual=(1.0,))
    first = replace(make_round(1, rejected=(" nope",), temperature=0.7), positions=(row, rej))  # noqa: F405
    second = replace(make_round(2, accepted=(" again",), final="!", origin=Origin.BONUS), positions=(row, row))  # noqa: F405
    records = []
    for chat, message, kind, rounds in ((1, 1, "chat", [first, second]), (1, 2, "compare-plain", [second]),
                                        (2, 3, "chat", [second])):
        rec = MessageRecord(chat, message, kind, f"prompt {message}", list(rounds), make_summary(rounds),  # noqa: F405
                            [{"role": "user", "content": f"prompt {message}"}], SamplingParams(temperature=0.7, seed=1),
                            SpecParams(k=3), "tiny-target", "tiny-draft")
        records.append(rec)
    return Trace(tuple(records), ({"role": "user", "content": "prompt 3"},),
                 EngineInfo("tiny-target", "tiny-draft", "cpu", "float32"),
                 Settings(SamplingParams(temperature=0.7), SpecParams(k=3), "be brief"), "0.1.0", "2026-11-22T10:00:00+00:00")


def test_json_round_trip_is_exact(tmp_path):
    trace = hand_made_trace()
    path = write_trace(trace, tmp_path / "t.json")
    data = json.loads(path.read_text(encoding="utf-8"))
    assert data["format"] == FORMAT and data["version"] == VERSION
    assert data["models"]["target_name"] == "tiny-target" and data["settings"]["system_prompt"] == "be brief"
    assert data["replies"][0]["rounds"][0]["positions"][1]["residual"] == [1.0]
    mask = os.umask(0)
    os.umask(mask)
    assert path.stat().st_mode & 0o777 == 0o666 & ~mask, "readable like any saved file, not private"
    back = read_trace(path)
    assert back == trace
    assert back.replies[0].rounds[0].positions[1].u == 0.9  # exact floats, not approximately


def test_unknown_fields_are_ignored_missing_required_ones_are_named():
    data = json.loads(json.dumps(to_json(hand_made_trace())))
    data["replies"][0]["rounds"][0]["a_future_field"] = [1, 2]
    assert from_json(data) == hand_made_trace()
    del data["replies"][0]["rounds"][0]["committed"][0]["origin"]
    with pytest.raises(TraceError, match=r"replies\[0\]\.rounds\[0\]\.committed\[0\]: missing 'origin'"):
        from_json(data)


@pytest.mark.parametrize("damage, message", [
    (lambda text: text[: len(text) // 2], r"not valid JSON \(line 1, column \d+: .*\); the file may be truncated"),
    (lambda text: json.dumps({**json.loads(text), "version": VERSION + 1}), r"saved by a newer SpecLens \(trace "
                                                                            r"format version 2\).*Update SpecLens"),
    (lambda text: json.dumps({**json.loads(text), "version": 0}), r"format version 0, older than any"),
    (lambda text: json.dumps({**json.loads(text), "version": "1"}), r"without a readable format version"),
    (lambda text: json.dumps({k: v for k, v in json.loads(text).items() if k != "format"}),
     r"not a SpecLens trace: it has no \"format\": \"speclens-trace\" header"),
    (lambda text: json.dumps([1, 2, 3]), r"not a SpecLens trace"),
    (lambda text: text.replace('"p":0.8', '"p":"high"', 1), r"damaged SpecLens trace: replies\[0\]\.rounds\[0\]\."
                                                            r"drafted\[0\]\.p: expected a number, got 'high'"),
    (lambda text: text.replace('"origin":"corrected"', '"origin":"guessed"', 1),
     r"damaged SpecLens trace: replies\[0\]\.rounds\[0\]\.committed\[1\]\.origin: expected one of 'accepted', "
     r"'corrected', 'bonus', 'plain', got 'guessed'"),
    (lambda text: text.replace('"tv":0.5', '"tv":7.5', 1), r"damaged SpecLens trace: replies\[0\]\.rounds\[0\]\."
                                                          r"positions\[1\]: PositionDist.tv must be in \[0, 1\]"),
])
def test_damaged_or_foreign_files_are_refused_clearly(tmp_path, damage, message):
    good = write_trace(hand_made_trace(), tmp_path / "good.json").read_text(encoding="utf-8")
    bad = damage(good)
    assert bad != good
    path = tmp_path / "bad.json"
    path.write_text(bad, encoding="utf-8")
    with pytest.raises(TraceError, match=message):
        read_trace(path)


def test_unreadable_and_binary_files(tmp_path):
    with pytest.raises(TraceError, match="could not be read"):
        read_trace(tmp_path / "missing.json")
    (tmp_path / "bin.json").write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TraceError, match="not UTF-8 text"):
        read_trace(tmp_path / "bin.json")


@pytest.mark.parametrize("content, message", [
    ("[" * 100_000 + "]" * 100_000, r"nested deeper than any trace"),
    ('{"format": "speclens-trace", "version": ' + "7" * 5000 + "}", r"holds a value that cannot be read"),
    ('{"format": "speclens-trace", "version": 1, "replies": ' + "[" * 100_000 + "]" * 100_000 + "}",
     r"nested deeper than any trace"),
])
def test_hostile_json_is_a_trace_error(tmp_path, content, message):
    """Deep nesting and huge integers were a RecursionError and a ValueError."""
    path = tmp_path / "hostile.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(TraceError, match=message):
        read_trace(path)


@pytest.mark.parametrize("text", [
    '{"a": [1, 2, {"b": [3, [4, {"c": 5}]]}], "d": "x", "a": []}', ' [ ] ', '{}', '\n{ "k" :\t[ {"x": null} , 2 ]\r}',
    '"just a string"', '[[[[[[1]]]]]]', '{"e": 1e400, "f": -0.0, "g": "\\u00e9\\ud800"}',
])
def test_the_stepped_parse_is_json_loads(text):
    from app.session.json_steps import loads_in_steps

    assert repr(loads_in_steps(text)) == repr(json.loads(text))


@pytest.mark.parametrize("text", ['{"a": 1,}', '[1 2]', '{"a" 1}', '{1: 2}', '[1] x', '', '{"a": [', '[', '{"a":}'])
def test_the_stepped_parse_refuses_what_json_loads_refuses(text):
    from app.session.json_steps import loads_in_steps

    with pytest.raises(json.JSONDecodeError):
        json.loads(text)
    with pytest.raises(json.JSONDecodeError):
        loads_in_steps(text)


def test_a_lone_surrogate_saves_and_reopens_exactly(tmp_path):
    """Text the app accepted never makes saving fail; JSON escapes keep it as it was."""
    from dataclasses import replace

    trace = hand_made_trace()
    trace = replace(trace, conversation=({"role": "user", "content": "a\ud800b"},))
    path = write_trace(trace, tmp_path / "s.json")
    assert read_trace(path) == trace


def test_a_failed_save_leaves_the_old_file(tmp_path, monkeypatch):
    path = write_trace(hand_made_trace(), tmp_path / "t.json")
    before = path.read_bytes()
    import app.session.trace as trace_mod

    def broken(*a, **k):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(trace_mod.os, "replace", broken)
    with pytest.raises(TraceError, match="could not be written: No space left on device"):
        write_trace(hand_made_trace(), path)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]


def test_reply_counts_say_what_they_hold():
    """Saving said "Wrote session.json (8 replies)" beside a trace window's "3 replies"."""
    from dataclasses import replace

    from app.session.trace import count_replies

    replies = hand_made_trace().replies
    assert count_replies(replies) == "2 chat replies, 1 Compare replay"
    more = replies + tuple(replace(replies[1], kind=k) for k in ("compare-speculative", "tune", "tune"))
    assert count_replies(more) == "2 chat replies, 2 Compare replays, 2 Tune K replays"
    assert count_replies(replies[:1]) == "1 chat reply"


def test_the_trace_window_counts_replays_apart(qtbot):
    from app.dialogs.trace_window import TraceWindow

    viewer = TraceWindow(hand_made_trace())
    qtbot.addWidget(viewer)
    assert "2 chat replies, 1 Compare replay \u00b7" in viewer.header.text()


def test_a_long_chat_is_painted_over_several_frames(qtbot, monkeypatch):
    """After a large trace was read, painting its chat held the window for seconds more."""
    from PySide6.QtCore import QTimer

    import app.dialogs.trace_window as tw

    at_once = tw.TraceWindow(hand_made_trace())
    qtbot.addWidget(at_once)
    assert not at_once.painting
    monkeypatch.setattr(tw, "PAINT_AT_ONCE_ROUNDS", 0)
    monkeypatch.setattr(tw, "PAINT_SLICE_ROUNDS", 1)
    sliced = tw.TraceWindow(hand_made_trace())
    qtbot.addWidget(sliced)
    assert sliced.painting and sliced.chat.toPlainText() != at_once.chat.toPlainText()
    fired = []
    QTimer.singleShot(0, lambda: fired.append(sliced.painting))
    qtbot.waitUntil(lambda: not sliced.painting, timeout=5000)
    assert fired  # the event loop ran between slices
    assert sliced.chat.toPlainText() == at_once.chat.toPlainText()
    assert view_model(sliced.chat) == view_model(at_once.chat)
    assert sliced.charts.buffer.theoretical == pytest.approx(at_once.charts.buffer.theoretical, nan_ok=True)


# ---- in the app --------------------------------------------------------------------------------------------------
def view_model(chat) -> list[tuple]:
    """What the chat shows, token by token, with the round each token's inspector reads."""
    return [(i, i.event) for i in chat.infos]


def test_saved_session_reopens_to_the_same_view(qtbot, make_window, tmp_path, dialogs):
    w = make_window(tiny(max_seq_len=512))  # noqa: F405
    w.controls.max_tokens_spin.setValue(30)
    w.controls.temp_slider.setValue(80)

    def say(text: str) -> None:
        w.input.setPlainText(text)
        w.send()
        wait_idle(qtbot, w, 60000)  # noqa: F405

    say("Tell me a story.")
    first_chat = (view_model(w.chat), w.chat.toPlainText())
    w.new_chat()
    say("Another one.")
    say("And one more.")
    path = tmp_path / "session.json"
    assert w.save_trace(str(path))
    assert w.statusBar().currentMessage() == "Wrote session.json (3 chat replies)"
    viewer = w.open_trace(str(path))
    assert viewer is not None and not dialogs
    qtbot.waitExposed(viewer)
    assert "3 chat replies \u00b7" in viewer.header.text()
    assert viewer.chat_select.count() == 2 and viewer.chat_select.currentData() == 2
    assert viewer.chat.toPlainText() == w.chat.toPlainText()
    assert view_model(viewer.chat) == view_model(w.chat)
    assert any(i.dist is not None and i.kind == "corrected" for i in viewer.chat.infos)
    for name in ("x", "acceptance", "tokens_per_s", "k", "accepted_len", "pos_drafted", "message_starts"):
        assert getattr(viewer.charts.buffer, name) == pytest.approx(getattr(w.charts.buffer, name), nan_ok=True), name
    viewer.chat_select.setCurrentIndex(0)
    assert (view_model(viewer.chat), viewer.chat.toPlainText()) == first_chat
    trace = viewer.trace
    assert [r.messages[-1]["content"] for r in trace.replies] == ["Tell me a story.", "Another one.", "And one more."]
    assert trace.replies[-1].messages[-3]["content"] == "Another one."  # the context the last request sent
    assert all(r.target == w.controller.info.target_name and r.sampling.temperature == 0.8 for r in trace.replies)
    assert trace.models == w.controller.info and trace.settings.spec == w.controls.spec_params()
    # the inspector opens on a token of the trace, with no model behind it
    info = next(i for i in viewer.chat.infos if i.kind == "rejected")
    viewer.chat.tokenClicked.emit(info)
    assert viewer.inspector.isVisible() and viewer.inspector.panel.info.dist == info.dist
    viewer.close()


@pytest.mark.parametrize("content, message", [
    ('{"format": "speclens-trace", "version": 1, "replies": [', "not valid JSON"),
    ('{"format": "speclens-trace", "version": 9, "replies": []}', "newer SpecLens"),
    ('{"hello": "world"}', "not a SpecLens trace"),
])
def test_opening_a_bad_trace_says_why_and_keeps_the_session(qtbot, window, dialogs, tmp_path, content, message):
    window.input.setPlainText("hello")
    window.send()
    wait_idle(qtbot, window)  # noqa: F405
    before = (view_model(window.chat), window.chat.toPlainText(), list(window.controller.stats.records),
              list(window.controller.conversation))
    path = tmp_path / "bad.json"
    path.write_text(content, encoding="utf-8")
    assert window.open_trace(str(path)) is None
    assert [(kind, title) for kind, title, _ in dialogs] == [("critical", "Could not open the trace")]
    assert message in dialogs[0][2] and "bad.json" in dialogs[0][2]
    assert (view_model(window.chat), window.chat.toPlainText(), list(window.controller.stats.records),
            list(window.controller.conversation)) == before


def _slow_reader(monkeypatch, release):
    """read_trace as a large file reads: it reports half the file parsed, then waits for `release`."""
    import app.dialogs.trace_window as tw

    monkeypatch.setattr(tw, "BIG_TRACE_BYTES", 1)
    real = tw.read_trace

    def slow(path, progress=None):
        progress(0.5)
        release.wait(10)
        return real(path, progress)

    monkeypatch.setattr(tw, "read_trace", slow)


def _trace_windows():
    from PySide6.QtWidgets import QApplication

    from app.dialogs.trace_window import TraceWindow
    return [w for w in QApplication.topLevelWidgets() if isinstance(w, TraceWindow) and w.isVisible()]


def test_a_large_trace_is_read_behind_a_progress_dialog(qtbot, window, dialogs, tmp_path, monkeypatch):
    """A 100,000-round trace froze the window for a minute while it was read."""
    import threading
    import time

    from PySide6.QtWidgets import QProgressDialog

    path = write_trace(hand_made_trace(), tmp_path / "big.json")
    release = threading.Event()
    _slow_reader(monkeypatch, release)
    t0 = time.monotonic()
    try:
        assert window.open_trace(str(path)) is None  # at once: the window opens when the read is done
        assert time.monotonic() - t0 < 2
        (progress,) = [d for d in window.findChildren(QProgressDialog) if d.isVisible()]
        qtbot.waitUntil(lambda: progress.value() == 499, timeout=5000)  # the event loop runs during the read
        assert "big.json" in progress.labelText()
    finally:
        release.set()
    qtbot.waitUntil(lambda: len(_trace_windows()) == 1, timeout=10000)
    (viewer,) = _trace_windows()
    assert viewer.trace == hand_made_trace() and not dialogs
    viewer.close()


def test_cancelling_a_large_trace_opens_nothing(qtbot, window, dialogs, tmp_path, monkeypatch):
    import threading

    from PySide6.QtWidgets import QProgressDialog

    path = write_trace(hand_made_trace(), tmp_path / "big.json")
    release = threading.Event()
    _slow_reader(monkeypatch, release)
    try:
        assert window.open_trace(str(path)) is None
        (progress,) = [d for d in window.findChildren(QProgressDialog) if d.isVisible()]
        progress.cancel()
    finally:
        release.set()
    qtbot.waitUntil(lambda: not window.findChildren(QProgressDialog), timeout=10000)
    assert not _trace_windows() and not dialogs


def test_save_trace_reports_a_write_failure(qtbot, window, dialogs, tmp_path):
    assert not window.save_trace(str(tmp_path / "nothing-yet.json"))  # no reply yet: nothing is written
    assert not (tmp_path / "nothing-yet.json").exists() and not dialogs
    window.input.setPlainText("hello")
    window.send()
    wait_idle(qtbot, window)  # noqa: F405
    assert not window.save_trace(str(tmp_path / "no-such-folder" / "t.json"))
    assert dialogs and dialogs[0][1] == "Could not save the trace" and "could not be written" in dialogs[0][2]
    assert window.save_trace(str(tmp_path / "t.json"))
    assert read_trace(tmp_path / "t.json").replies[0].rounds == window.controller.stats.records[0].rounds


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    env.pop("DISPLAY", None)
    return subprocess.run([sys.executable, "-m", "app.main", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)


def test_command_line_opens_a_trace(tmp_path):
    path = write_trace(hand_made_trace(), tmp_path / "lesson.json")
    done = run_cli("--smoke-test", str(path))
    assert done.returncode == 0, done.stderr
    # chat 2 (the last) is shown: one reply, one round of two tokens (an accepted draft and the bonus)
    assert "smoke-test ok: trace lesson.json, 2 chat replies, 2 tokens painted" in done.stdout


def test_command_line_refuses_a_bad_trace(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"format": "speclens-trace", "version": 1, "replies": [{"chat": ', encoding="utf-8")
    done = run_cli("--smoke-test", str(path))
    assert done.returncode == 2
    assert "speclens: broken.json is not valid JSON" in done.stderr


def test_a_trace_takes_no_model_arguments():
    from app.main import parse_args

    assert parse_args(["t.json"]).trace == "t.json" and parse_args([]).trace is None
    with pytest.raises(SystemExit):
        parse_args(["t.json", "--target", "some/model"])
