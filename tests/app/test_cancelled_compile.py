"""Cancelling a load while the engine compiles the CPU kernels: the compile goes on in the engine process (so the
next load need not start it again) until the app quits, and the window says so, and why, rather than leave a
compile running unsaid. That the compile does end with the engine process is tests/engine/
test_compile_ends_with_engine.py."""
from __future__ import annotations

import time

from engine.service.loaders import Factory
from tests.app_fixtures import LOAD_TIMEOUT_MS

STAGE = "Compiling the CPU kernels (once; about a minute on 2 cores): 3 s"


def compiling_loader(target, draft, device, progress, cancelled, *, stage: str):
    """Runs in the engine process: a load that reports `stage` until it is cancelled (at most 20 s)."""
    end = time.monotonic() + 20
    while not cancelled() and time.monotonic() < end:
        progress(stage, -1.0)
        time.sleep(0.05)
    raise InterruptedError("cancelled")


def cancel_during(qtbot, make_window, stage: str) -> str:
    # Qt imported here: the engine process imports this module for its loader, and must not import Qt
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QPushButton

    w = make_window(Factory("tests.app.test_cancelled_compile:compiling_loader", {"stage": stage}), load=False,
                    show=False)
    w.load_models(None)
    qtbot.waitUntil(lambda: w.load_dialog is not None and w.load_dialog.labelText().startswith(stage[:20]),
                    timeout=LOAD_TIMEOUT_MS)
    qtbot.mouseClick(w.load_dialog.findChild(QPushButton), Qt.MouseButton.LeftButton)  # its Cancel button
    qtbot.waitUntil(lambda: w.load_dialog is None, timeout=10000)
    return w.statusBar().currentMessage()


def test_a_load_cancelled_mid_compile_says_the_compile_goes_on_and_why(qtbot, make_window):
    said = cancel_during(qtbot, make_window, STAGE)
    assert said.startswith("Loading cancelled.")
    assert "compile goes on in the background, so the next load need not start it again" in said
    assert "quitting SpecLens stops it" in said


def test_a_load_cancelled_at_another_stage_says_nothing_of_a_compile(qtbot, make_window):
    said = cancel_during(qtbot, make_window, "Converting target")
    assert said == "Loading cancelled."

