"""The banner shown above the chat when the engine process dies: one sentence and a way back."""
from __future__ import annotations

from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QColor, QPainter, QPen
from PySide6.QtWidgets import QFrame, QHBoxLayout, QLabel, QPushButton, QWidget

from app.views.theme import OKABE_ITO


class CrashBanner(QFrame):
    """What happened to the engine process, in one sentence, and a way back: shown above the chat."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.reload_button = QPushButton("Reload models")
        self.reload_button.setToolTip("Start a new engine process and load the same models; the chat is kept")
        self.dismiss_button = QPushButton("Dismiss")
        lay = QHBoxLayout(self)
        lay.setContentsMargins(10, 6, 6, 6)
        lay.addWidget(self.label, 1)
        lay.addWidget(self.reload_button)
        lay.addWidget(self.dismiss_button)
        self.dismiss_button.clicked.connect(self.hide)
        self.hide()

    def show_message(self, sentence: str) -> None:
        self.label.setText(f"<span style='color:{OKABE_ITO['vermillion']}'>\u26a0</span> {sentence} "
                           "The chat, the charts and the session stats are kept.")
        self.show()

    def paintEvent(self, event) -> None:  # noqa: N802 - Qt naming
        """A vermillion outline, painted rather than style-sheeted: a style sheet would pin the label's colours
        to the palette of the moment, unreadable after a switch to the dark theme."""
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing)
        p.setPen(QPen(QColor(OKABE_ITO["vermillion"]), 1.2))
        p.drawRoundedRect(QRectF(self.rect()).adjusted(0.6, 0.6, -0.6, -0.6), 4, 4)
