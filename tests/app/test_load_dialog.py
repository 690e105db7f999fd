"""The load dialog names each long step and never sits at a number that does not move; a load without compiled
kernels says so in the dialog and keeps saying it in the status line."""
import re
import time

from PySide6.QtWidgets import QLabel

from app.dialogs.load_dialog import STEPS, STILL_S, LoadDialog
from engine.api.protocol import EngineInfo
from tests.app_fixtures import fake

NOTICE = ("No compiled CPU kernels (no C++ compiler found), so replies run about 11\u00d7 slower: install g++ and "
          "restart.")


def test_a_step_that_does_not_move_shows_its_elapsed_time_and_a_busy_bar(qtbot):
    d = LoadDialog(None)
    qtbot.addWidget(d)
    d.show_progress("Placing target on cpu", 0.75)
    assert d.labelText() == "Placing target on cpu" and d.value() == int(0.75 * STEPS)
    t0 = time.monotonic()
    qtbot.waitUntil(lambda: re.fullmatch(r"Placing target on cpu\u2026 \d+ s", d.labelText()) is not None, timeout=4000)
    shown = int(d.labelText().split()[-2])
    assert STILL_S - 0.5 <= shown <= time.monotonic() - t0 + 0.5  # the seconds this step has taken
    assert d.maximum() == 0  # a busy bar, not 75% standing still
    d.show_progress("Placing target on cpu", 0.75)  # the same report again is no news: the count goes on
    assert d.labelText().endswith(" s") and d.maximum() == 0
    d.show_progress("Ready", 1.0)
    assert d.labelText() == "Ready" and d.maximum() == STEPS and d.value() == STEPS


def test_a_step_that_counts_its_own_seconds_is_shown_as_it_is(qtbot):
    d = LoadDialog(None)
    qtbot.addWidget(d)
    for s in range(4):
        d.show_progress(f"Compiling the CPU kernels (once; about a minute on 2 cores): {s} s", -1.0)
        qtbot.wait(600)
        assert d.labelText() == f"Compiling the CPU kernels (once; about a minute on 2 cores): {s} s"
        assert d.maximum() == 0


def test_the_kernels_sentence_stays_under_every_step(qtbot):
    d = LoadDialog(None)
    qtbot.addWidget(d)
    d.show_progress(f"Placing draft on cpu\n{NOTICE}", 0.9)
    qtbot.waitUntil(lambda: re.match(r"Placing draft on cpu\u2026 \d+ s\n", d.labelText()) is not None, timeout=4000)
    assert d.labelText().endswith(NOTICE)


def test_the_status_line_keeps_the_kernels_sentence(qtbot, make_window):
    w = make_window(fake(), load=False)
    info = EngineInfo("t.gguf", "d.gguf", "cpu", "Q4_K_M, int8 activations, pure-torch fallback", NOTICE)
    w.model_loading.on_loaded(info)
    label = w.findChild(QLabel, "kernelsNotice")
    assert label is w.notice_label and label.isVisible() and label.text() == NOTICE
    w.statusBar().showMessage("Loaded t.gguf + d.gguf", 100)  # a passing message covers it, then it is back
    qtbot.waitUntil(lambda: w.notice_label.isVisible(), timeout=2000)
    w.model_loading.on_loaded(EngineInfo("t.gguf", "d.gguf", "cpu", "Q4_K_M, int8 activations, AVX2 kernels"))
    assert not w.notice_label.isVisible()
