"""The modal progress dialog of a model load: the engine's stage as its label, its fraction as the bar.

A stage that reports no movement for a while (placing a model, a step whose length is unknown) turns the bar
into a busy bar and shows how long it has taken, so nothing sits at a number that does not move. The engine's
own stages carry their measures: bytes while a model is assembled from its parts, elapsed seconds while the CPU
kernels compile (once). A second line under the stage (the engine's sentence about missing kernels) stays as is.
"""
from __future__ import annotations

import time
from pathlib import Path

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QLabel, QProgressDialog, QWidget

STEPS = 1000  # the bar's resolution
ELLIPSIS = "\u2026"
STILL_S = 1.5  # a stage unchanged for this long shows its elapsed time and a busy bar
COMPILING = "Compiling the CPU kernels"  # how the engine's compile stage begins (engine/cpu/build.py's Ticker)


def describe_target(target: str | None) -> str:
    return "the embedded model pair" if target is None else Path(target).name


class LoadDialog(QProgressDialog):
    """Shown at once; Cancel emits `canceled` (the window asks the engine to stop at its next progress check)."""

    def __init__(self, target: str | None, parent: QWidget | None = None) -> None:
        first = f"Loading {describe_target(target)}\u2026"
        super().__init__(first, "Cancel", 0, STEPS, parent)
        label = QLabel(first)
        label.setWordWrap(True)  # the engine's sentence about missing kernels is longer than the dialog is wide
        self.setLabel(label)
        self.setWindowTitle("Loading models")
        self.setWindowModality(Qt.WindowModality.WindowModal)
        self.setMinimumDuration(0)
        self.setAutoClose(False)
        self.setAutoReset(False)
        self.setMinimumWidth(480)
        self.setMaximumWidth(560)
        self.setValue(0)
        self._stage, self._fraction = first, 0.0
        self._stage_since = self._moved_at = time.monotonic()
        self._timer = QTimer(self)
        self._timer.setInterval(500)
        self._timer.timeout.connect(self._tick)
        self._timer.start()

    @property
    def compiling(self) -> bool:
        """The engine is compiling the kernels now: a cancel leaves that compile running (until the app quits)."""
        return self._stage.startswith(COMPILING)

    def show_progress(self, stage: str, fraction: float) -> None:
        """fraction in [0, 1], or < 0 for a stage of unknown length (a busy bar)."""
        if stage == self._stage and fraction == self._fraction:
            return  # no news: the busy bar and the elapsed time stay
        now = time.monotonic()
        self._moved_at = now
        if stage != self._stage:
            self._stage_since = now
        self._stage, self._fraction = stage, fraction
        self.setLabelText(stage)
        if fraction < 0:
            self.setRange(0, 0)
        else:
            self.setRange(0, STEPS)
            self.setValue(int(min(fraction, 1.0) * STEPS))

    def _tick(self) -> None:
        """A stage that has not moved for STILL_S: a busy bar and the seconds it has taken so far."""
        now = time.monotonic()
        if now - self._moved_at < STILL_S:
            return
        head, sep, rest = self._stage.partition("\n")
        head = head.rstrip(ELLIPSIS + ".")
        self.setLabelText(f"{head}{ELLIPSIS} {now - self._stage_since:.0f} s{sep}{rest}")
        if self.maximum() != 0:
            self.setRange(0, 0)
