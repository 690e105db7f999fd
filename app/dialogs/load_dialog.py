"""The modal progress dialog of a model load: the engine's stage as its label, its fraction as the bar."""
from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QProgressDialog, QWidget

STEPS = 1000  # the bar's resolution


def describe_target(target: str | None) -> str:
    return "the embedded model pair" if target is None else Path(target).name


class LoadDialog(QProgressDialog):
    """Shown at once; Cancel emits `canceled` (the window asks the engine to stop at its next progress check)."""

    def __init__(self, target: str | None, parent: QWidget | None = None) -> None:
        super().__init__(f"Loading {describe_target(target)}\u2026", "Cancel", 0, STEPS, parent)
        self.setWindowTitle("Loading models")
        self.setWindowModality(Qt.WindowModality.WindowModal)
        self.setMinimumDuration(0)
        self.setAutoClose(False)
        self.setAutoReset(False)
        self.setMinimumWidth(420)
        self.setValue(0)

    def show_progress(self, stage: str, fraction: float) -> None:
        """fraction in [0, 1], or < 0 for a stage of unknown length (a busy bar)."""
        self.setLabelText(stage)
        if fraction < 0:
            self.setRange(0, 0)
        else:
            self.setRange(0, STEPS)
            self.setValue(int(min(fraction, 1.0) * STEPS))
