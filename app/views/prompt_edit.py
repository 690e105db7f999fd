"""The message box: Enter sends, Shift+Enter starts a new line; grows with its text up to a few lines."""
from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QPlainTextEdit, QWidget


class PromptEdit(QPlainTextEdit):
    submitted = Signal()

    MIN_LINES, MAX_LINES = 2, 8

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setPlaceholderText("Message the model \u2014 Enter to send, Shift+Enter for a new line, Esc to stop")
        self.setTabChangesFocus(True)
        self.document().contentsChanged.connect(self._fit)
        self._fit()

    def keyPressEvent(self, e: QKeyEvent) -> None:
        if e.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter) and not (
            e.modifiers() & Qt.KeyboardModifier.ShiftModifier
        ):
            e.accept()
            self.submitted.emit()
            return
        super().keyPressEvent(e)

    def _fit(self) -> None:
        lines = min(max(self.document().lineCount(), self.MIN_LINES), self.MAX_LINES)
        margins = self.contentsMargins()
        height = (lines * self.fontMetrics().lineSpacing() + 2 * self.document().documentMargin()
                  + margins.top() + margins.bottom() + 2)
        self.setFixedHeight(int(height))
