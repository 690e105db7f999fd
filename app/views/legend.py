"""The legend above the chat: a swatch for each way a token can be made, in the current palette."""
from __future__ import annotations

from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import QHBoxLayout, QLabel, QWidget

from app.views.theme import ORIGIN_HELP, ORIGIN_LABEL, token_colours
from app.views.tokens import REJECTED
from engine.api.events import Origin


class OriginLegend(QWidget):
    """Swatches for the four origins and the struck-through drafts, in the current palette."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(2, 0, 2, 0)
        lay.setSpacing(10)
        self.labels: dict[str, QLabel] = {}
        for key in [o.value for o in Origin] + [REJECTED]:
            label = QLabel(self)
            label.setTextFormat(Qt.TextFormat.RichText)
            if key == REJECTED:
                label.setToolTip("A draft the target rejected (struck through); View \u203a Show rejected drafts")
            else:
                label.setToolTip(ORIGIN_HELP[Origin(key)].capitalize())
            lay.addWidget(label)
            self.labels[key] = label
        lay.addStretch(1)
        self._paint()

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self._paint()

    def _paint(self) -> None:
        c = token_colours(self.palette())
        for key, label in self.labels.items():
            if key == REJECTED:
                style = f"color:{c.rejected.name()}; text-decoration:line-through;"
                name = "Rejected draft"
            else:
                origin = Origin(key)
                style = f"background-color:{c.tint[origin].name()}; color:{c.text.name()};"
                name = ORIGIN_LABEL[origin]
            label.setText(f"<span style='{style}'>&nbsp;{name}&nbsp;</span>")
