"""Run › Step through in the window: phases on the tiny real engine through the engine process, the provisional
round in the chat, Next / Continue / Stop and their keys, and the same tokens stepped or not."""
import time

from PySide6.QtCore import Qt, QTimer

from app.views.stepper import phase_html, phase_pieces, rollback_line, verdict_of
from app.views.tokens import DISCARDED, PROVISIONAL, REJECTED, visible
from engine.api.events import CacheRollback, CommittedToken, Origin, Phase, PhaseEvent
from tests.app_fixtures import tiny, wait_idle

PROMPT = "Tell me about the sea."


def decided_event() -> PhaseEvent:
    committed = (CommittedToken(5, "a", Origin.ACCEPTED, 0, 0.8, 0.5), CommittedToken(9, "Z", Origin.CORRECTED, 1, 0.3))
    return PhaseEvent(3, Phase.DECIDED, "model", 3, (5, 6, 7), ("a", "b", " c"), (0.5, 0.6, 0.7), (0.8, 0.1, 0.2),
                      accepted=1, committed=committed,
                      rollback=(CacheRollback("target", 40, 38, 5, 5), CacheRollback("draft", 39, 38, 5, 5)))


def test_phase_pieces_and_table_from_scripted_events():
    drafted = PhaseEvent(3, Phase.DRAFTED, "model", 3, (5, 6, 7), ("a", "b", " c"), (0.5, 0.6, 0.7))
    assert phase_pieces(drafted) == [("a", PROVISIONAL), ("b", PROVISIONAL), (" c", PROVISIONAL)]
    assert verdict_of(drafted, 0) == ""
    ev = decided_event()
    assert phase_pieces(ev) == [("a", "accepted"), ("b", REJECTED), (" c", DISCARDED), ("Z", "corrected")]
    assert phase_pieces(ev, show_rejected=False) == [("a", "accepted"), ("Z", "corrected")]
    assert [verdict_of(ev, i) for i in range(3)] == ["accepted", "rejected", "discarded"]
    table = phase_html(ev)
    for text in ("0.500", "0.800", "min(1, p/q)", "accepted", "rejected", "discarded", "correction"):
        assert text in table
    assert rollback_line(ev.rollback[0]) == "Target cache: 40 \u2192 38 positions (2 freed), 5 \u2192 5 KV blocks (0 freed)"
    assert "Draft cache" in table


def test_provisional_tokens_are_no_part_of_the_reply(qtbot):
    from app.views.chat_view import ChatView
    from tests.app_fixtures import make_round

    view = ChatView()
    qtbot.addWidget(view)
    view.begin_assistant("A")
    view.feed(make_round(1, accepted=("Hello",), final=" world"))
    view.flush()
    before = view.toPlainText()
    view.show_provisional([("xy", PROVISIONAL), (" z", PROVISIONAL)])
    assert view.toPlainText() == before + "xy z" and view.provisional_text == "xy z"
    view.set_show_rejected(False)  # a re-render keeps it
    view.set_show_rejected(True)
    assert view.provisional_text == "xy z"
    view.feed(make_round(2, accepted=(" again",), final="!"))
    view.flush()  # the real round takes its place
    assert view.provisional_text == "" and "xy" not in view.toPlainText()
    assert view.reply_text() == "Hello world again!"


def _paused(window):
    return window.controller.paused


def test_step_through_in_the_window(qtbot, make_window):
    w = make_window(tiny())
    w.controls.seed_spin.setValue(5)
    w.controls.temp_slider.setValue(90)
    w.controls.max_tokens_spin.setValue(14)
    w.controls.k_slider.setValue(3)
    w.controls.stop_check.setChecked(False)  # all three drafts every round (the tiny draft is rarely sure)
    # Unstepped first: the reference.
    w.input.setPlainText(PROMPT)
    w.send()
    wait_idle(qtbot, w)
    reference = w.controller.stats.records[-1].summary
    w.new_chat()

    w.stepper.toggle_action.setChecked(True)
    assert w.stepper.isVisible() and not w.stepper.next_button.isEnabled()
    w.input.setPlainText(PROMPT)
    w.send()
    qtbot.waitUntil(lambda: _paused(w) is not None, timeout=20000)
    ev = _paused(w)
    assert ev.phase == Phase.DRAFTED and ev.round == 1 and len(ev.tokens) == 3
    assert w.chat.provisional_text == "".join(visible(t) if not t.strip() else t.replace("\n", "\u21b5")
                                              for t in ev.texts)
    assert w.stepper.next_button.isEnabled() and w.stepper.continue_button.isEnabled()
    assert "Draft proposed" in w.stepper.title.text()
    # The window stays live while the engine waits: its event loop runs timers at once.
    fired = []
    QTimer.singleShot(0, lambda: fired.append(time.monotonic()))
    t = time.monotonic()
    qtbot.waitUntil(lambda: bool(fired), timeout=1000)
    assert fired[0] - t < 0.5
    assert w.controller.busy and _paused(w) is ev  # still paused

    qtbot.keyClick(w, Qt.Key.Key_F10)  # Next
    qtbot.waitUntil(lambda: _paused(w) is not None and _paused(w).phase == Phase.VERIFIED, timeout=10000)
    assert "p(t)" in w.stepper.detail.text()
    w.stepper.next_button.click()
    qtbot.waitUntil(lambda: _paused(w) is not None and _paused(w).phase == Phase.DECIDED, timeout=10000)
    decided = _paused(w)
    assert "Target cache" in w.stepper.detail.text() and "Draft cache" in w.stepper.detail.text()
    assert decided.accepted is not None
    qtbot.keyClick(w, Qt.Key.Key_F10)
    qtbot.waitUntil(lambda: _paused(w) is not None and _paused(w).round == 2, timeout=10000)
    record = w.controller.active.record
    assert [r.round for r in record.rounds] == [1] and record.rounds[0].committed == decided.committed
    qtbot.keyClick(w, Qt.Key.Key_F5)  # Continue: the rest without pausing
    wait_idle(qtbot, w, timeout=20000)
    stepped = w.controller.stats.records[-1].summary
    assert stepped.token_ids == reference.token_ids and stepped.text == reference.text
    assert w.chat.provisional_text == "" and w.chat.reply_text() == reference.text
    assert _paused(w) is None and not w.stepper.next_button.isEnabled()


def test_stop_while_paused(qtbot, make_window):
    w = make_window(tiny())
    w.controls.max_tokens_spin.setValue(30)
    w.stepper.toggle_action.setChecked(True)
    w.input.setPlainText(PROMPT)
    w.send()
    qtbot.waitUntil(lambda: _paused(w) is not None, timeout=20000)
    # The status line said "Generating" while the engine waited for a click
    assert w.round_label.text().startswith("Paused (step-through") and "Generating" not in w.round_label.text()
    qtbot.keyClick(w, Qt.Key.Key_Escape)
    wait_idle(qtbot, w, timeout=10000)
    s = w.controller.stats.records[-1].summary
    assert s.stop_reason == "cancelled" and s.rounds == 1  # the paused round finished, no other started
    assert w.chat.provisional_text == "" and _paused(w) is None


def test_toggling_off_mid_reply_continues(qtbot, make_window):
    w = make_window(tiny())
    w.controls.max_tokens_spin.setValue(20)
    w.stepper.toggle_action.setChecked(True)
    w.input.setPlainText(PROMPT)
    w.send()
    qtbot.waitUntil(lambda: _paused(w) is not None, timeout=20000)
    w.stepper.toggle_action.setChecked(False)
    wait_idle(qtbot, w, timeout=10000)
    s = w.controller.stats.records[-1].summary
    assert s.stop_reason == "length" and not w.stepper.isVisible() and w.chat.provisional_text == ""
