"""The legend above the chat: a swatch for each way a token can be made, in the current palette."""
from __future__ import annotations

from PySide6.QtCore import QEvent, Qt
from PySide6.QtWidgets import QGridLayout, QLabel, QWidget

from app.views.theme import ORIGIN_HELP, ORIGIN_LABEL, token_colours
from app.views.tokens import REJECTED
from engine.api.events import Origin


class OriginLegend(QWidget):
    """Swatches for the four origins and the struck-through drafts, in the current palette: one row, or two when the
    chat column is too narrow for one (the legend must not set the window's least width)."""

    SPACING = 10

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.grid = QGridLayout(self)
        self.grid.setContentsMargins(2, 0, 2, 0)
        self.grid.setHorizontalSpacing(self.SPACING)
        self.grid.setVerticalSpacing(2)
        self.columns = 0
        self.labels: dict[str, QLabel] = {}
        for key in [o.value for o in Origin] + [REJECTED]:
            label = QLabel(self)
            label.setTextFormat(Qt.TextFormat.RichText)
            if key == REJECTED:
                label.setToolTip("A draft the target rejected (struck through); View \u203a Show rejected drafts")
            else:
                label.setToolTip(ORIGIN_HELP[Origin(key)].capitalize())
            self.labels[key] = label
        self._paint()
        self._place(len(self.labels))

    def _row_width(self, labels: list[QLabel]) -> int:
        m = self.grid.contentsMargins()
        return sum(lb.sizeHint().width() for lb in labels) + self.SPACING * (len(labels) - 1) + m.left() + m.right()

    def _place(self, columns: int) -> None:
        if columns == self.columns:
            return
        self.columns = columns
        labels = list(self.labels.values())
        for lb in labels:
            self.grid.removeWidget(lb)
        for i, lb in enumerate(labels):
            self.grid.addWidget(lb, i // columns, i % columns)
        for c in range(len(labels) + 1):
            self.grid.setColumnStretch(c, 0)
        self.grid.setColumnStretch(columns, 1)  # the swatches to the left
        half = (len(labels) + 1) // 2
        self.setMinimumWidth(max(self._row_width(labels[:half]), self._row_width(labels[half:])))

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt naming
        super().resizeEvent(event)
        labels = list(self.labels.values())
        self._place(len(labels) if self.width() >= self._row_width(labels) else (len(labels) + 1) // 2)

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
