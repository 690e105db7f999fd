"""The distribution inspector: what the target (p) and the draft (q) thought at one token's position.

Click a token in the chat and `InspectorDock` shows its row of the verify pass (engine/api/dists.py): paired bars of p
and q over the top tokens, the residual norm(max(0, p - q)) a correction was drawn from, the uniform draw u of a
drafted token beside p and q (kept when u * q < p), and the total-variation distance, whose complement
sum(min(p, q)) is the chance a draft passes there. Plain data in, painted widgets out: no torch here.
"""
from __future__ import annotations

import html
from dataclasses import dataclass

from PySide6.QtCore import QEvent, QRectF, QSize, Qt
from PySide6.QtGui import QColor, QFont, QFontMetrics, QPainter, QPalette
from PySide6.QtWidgets import QDockWidget, QLabel, QScrollArea, QVBoxLayout, QWidget

from app.views.theme import OKABE_ITO, ORIGIN_HUE, ORIGIN_LABEL, REJECTED_HUE, mix
from app.views.tokens import DISCARDED, REJECTED, TokenInfo, visible
from engine.api.dists import PositionDist
from engine.api.events import Origin

P_HUE = OKABE_ITO["blue"]  # the target
Q_HUE = OKABE_ITO["orange"]  # the draft
RESIDUAL_HUE = OKABE_ITO["vermillion"]
DRAFTED = (Origin.ACCEPTED.value, REJECTED, DISCARDED)  # kinds that are a drafted token (they have a u)


@dataclass(frozen=True)
class BarRow:
    """One token's bars: a value per series (None: that series has none here)."""

    label: str
    values: tuple[float | None, ...]
    mark: str = ""  # "" or a short note painted after the label: "chosen", "drafted", ...


def pct(v: float | None) -> str:
    if v is None:
        return "\u2014"
    if 0 < v < 0.001:
        return "<0.1%"
    return f"{v * 100:.1f}%"


def verdict(u: float, p: float, q: float) -> tuple[bool, str]:
    """The accept test as the engine runs it (u * q < p, i.e. u < p / q without dividing), as rich text."""
    kept = u * q < p
    sign = "<" if kept else "\u2265"
    hue = ORIGIN_HUE[Origin.ACCEPTED] if kept else REJECTED_HUE
    return kept, (f"u = <b>{u:.4f}</b> &nbsp; q(t) = <b>{q:.4f}</b> &nbsp; p(t) = <b>{p:.4f}</b><br>"
                  f"u\u00b7q = {u * q:.4f} {sign} p(t) \u2192 <b style='color:{hue}'>{'kept' if kept else 'rejected'}"
                  "</b>")


def pair_rows(dist: PositionDist, marks: dict[int, str]) -> list[BarRow]:
    """p and q side by side, p's top tokens first (the order the engine recorded), then the draft's."""
    qs = dist.q if dist.q is not None else (None,) * len(dist.ids)
    return [BarRow(visible(t), (p, q), marks.get(i, "")) for i, t, p, q in zip(dist.ids, dist.texts, dist.p, qs)]


def residual_rows(dist: PositionDist, marks: dict[int, str]) -> list[BarRow]:
    return [BarRow(visible(t), (r,), marks.get(i, ""))
            for i, t, r in zip(dist.residual_ids, dist.residual_texts, dist.residual)]


class Bars(QWidget):
    """Horizontal bars, one group per token: a label column, one thin bar per series, the values at the right.
    Scaled to the largest value shown, so small probabilities stay readable (the values say the scale)."""

    BAR_H = 7
    GAP = 2

    def __init__(self, hues: tuple[str, ...], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.hues = hues
        self.rows: list[BarRow] = []
        self.setSizePolicy(self.sizePolicy().horizontalPolicy(), self.sizePolicy().Policy.Fixed)

    def set_rows(self, rows: list[BarRow]) -> None:
        self.rows = rows
        self.updateGeometry()
        self.update()

    def _row_h(self) -> int:
        return max(len(self.hues) * (self.BAR_H + self.GAP) + 6, self.fontMetrics().height() + 4)

    def sizeHint(self) -> QSize:  # noqa: N802 - Qt naming
        return QSize(300, len(self.rows) * self._row_h() + 4)

    def minimumSizeHint(self) -> QSize:  # noqa: N802 - Qt naming
        return QSize(220, self.sizeHint().height())

    def paintEvent(self, event) -> None:  # noqa: N802 - Qt naming
        if not self.rows:
            return
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        pal = self.palette()
        text, base = pal.color(QPalette.ColorRole.WindowText), pal.color(QPalette.ColorRole.Window)
        fm = QFontMetrics(self.font())
        bold = QFont(self.font())
        bold.setBold(True)
        label_w = min(max(fm.horizontalAdvance(r.label) for r in self.rows) + 10, 110)
        value_w = fm.horizontalAdvance("100.0%") * len(self.hues) + 8 * len(self.hues)
        small = QFont(self.font())
        small.setPointSizeF(max(self.font().pointSizeF() * 0.85, 6.5))
        sfm = QFontMetrics(small)
        mark_w = max((sfm.horizontalAdvance(f"\u25c2 {r.mark}") for r in self.rows if r.mark), default=0)
        value_w += mark_w + 6 if mark_w else 0
        bar_x, bar_w = label_w + 4, max(self.width() - label_w - value_w - 10, 40)
        top = max((v for r in self.rows for v in r.values if v is not None), default=0.0) or 1.0
        row_h = self._row_h()
        for n, row in enumerate(self.rows):
            y = 2 + n * row_h
            if row.mark:  # the token this panel is about: a faint band behind its row
                painter.fillRect(QRectF(0, y, self.width(), row_h - 2), mix(base, text, 0.08))
            painter.setFont(bold if row.mark else self.font())
            painter.setPen(text)
            label = fm.elidedText(row.label, Qt.TextElideMode.ElideRight, label_w - 6)
            painter.drawText(QRectF(4, y, label_w - 4, row_h - 2),
                             Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft, label)
            bars_h = len(self.hues) * (self.BAR_H + self.GAP) - self.GAP
            by = y + (row_h - 2 - bars_h) / 2
            track = mix(base, text, 0.06)
            for s, (hue, v) in enumerate(zip(self.hues, row.values)):
                rect = QRectF(bar_x, by + s * (self.BAR_H + self.GAP), bar_w, self.BAR_H)
                painter.fillRect(rect, track)
                if v:
                    painter.setPen(Qt.PenStyle.NoPen)
                    painter.setBrush(QColor(hue))
                    painter.drawRoundedRect(QRectF(rect.x(), rect.y(), max(bar_w * v / top, 1.5), self.BAR_H), 2, 2)
            painter.setFont(self.font())
            values = "  ".join(pct(v) for v in row.values)
            painter.setPen(mix(base, text, 0.75))
            painter.drawText(QRectF(bar_x + bar_w + 6, y, value_w, row_h - 2),
                             Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignLeft, values)
            if row.mark:
                painter.setFont(small)
                painter.setPen(text)
                painter.drawText(QRectF(0, y, self.width() - 4, row_h - 2),
                                 Qt.AlignmentFlag.AlignVCenter | Qt.AlignmentFlag.AlignRight, f"\u25c2 {row.mark}")
        painter.end()


class DrawGauge(QWidget):
    """The accept test on one line: [0, min(1, p/q)) passes, the rest rejects, and a tick at u."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.u: float | None = None
        self.ratio = 0.0
        self.setFixedHeight(30)

    def set_draw(self, u: float | None, ratio: float) -> None:
        self.u, self.ratio = u, min(max(ratio, 0.0), 1.0)
        self.update()

    def paintEvent(self, event) -> None:  # noqa: N802 - Qt naming
        if self.u is None:
            return
        painter = QPainter(self)
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        pal = self.palette()
        text, base = pal.color(QPalette.ColorRole.WindowText), pal.color(QPalette.ColorRole.Window)
        x0, w, y, h = 6.0, self.width() - 12.0, 6.0, 10.0
        painter.fillRect(QRectF(x0, y, w * self.ratio, h), mix(base, QColor(ORIGIN_HUE[Origin.ACCEPTED]), 0.7))
        painter.fillRect(QRectF(x0 + w * self.ratio, y, w * (1 - self.ratio), h), mix(base, QColor(REJECTED_HUE), 0.55))
        ux = x0 + w * min(max(self.u, 0.0), 1.0)
        painter.setPen(text)
        painter.drawLine(int(ux), int(y - 4), int(ux), int(y + h + 4))
        small = QFont(self.font())
        small.setPointSizeF(max(self.font().pointSizeF() * 0.8, 6.5))
        painter.setFont(small)
        painter.drawText(QRectF(x0, y + h + 1, 30, 12), Qt.AlignmentFlag.AlignLeft, "0")
        painter.drawText(QRectF(x0 + w - 30, y + h + 1, 30, 12), Qt.AlignmentFlag.AlignRight, "1")
        label_x = min(max(ux - 20, x0 + 12), x0 + w - 52)
        painter.drawText(QRectF(label_x, y + h + 1, 40, 12), Qt.AlignmentFlag.AlignHCenter, f"u {self.u:.2f}")
        painter.end()


TITLE_TOKEN_CHARS = 24  # a token this long still fits the title line of a dock at its narrowest


def _short(text: str) -> str:
    """A long token (a run of spaces or underscores, a long identifier) has no place to wrap, and was cut off at
    the dock's edge: show its start and its length."""
    if len(text) <= TITLE_TOKEN_CHARS:
        return text
    return f"{text[:TITLE_TOKEN_CHARS - 4]}\u2026 ({len(text)} chars)"


class InspectorPanel(QWidget):
    """The inspector's content for one token (`show_token`); `clear()` shows the hint again."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.info: TokenInfo | None = None
        self.title = QLabel()
        self.title.setTextFormat(Qt.TextFormat.RichText)
        self.title.setWordWrap(True)
        self.where = self._muted_label()
        self.note = self._muted_label()
        self.verdict = QLabel()
        self.verdict.setTextFormat(Qt.TextFormat.RichText)
        self.verdict.setWordWrap(True)
        self.verdict.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.gauge = DrawGauge()
        self.overlap = QLabel()
        self.overlap.setTextFormat(Qt.TextFormat.RichText)
        self.overlap.setWordWrap(True)
        self.pair_title = self._section("")
        self.legend = QLabel()
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        self.pair = Bars((P_HUE, Q_HUE))
        self.residual_title = self._section("Residual norm(max(0, p \u2212 q))")
        self.residual_note = self._muted_label()
        self.residual = Bars((RESIDUAL_HUE,))
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 8, 10, 10)
        lay.setSpacing(6)
        for w in (self.title, self.where, self.note, self.verdict, self.gauge, self.overlap, self.pair_title,
                  self.legend, self.pair, self.residual_title, self.residual_note, self.residual):
            lay.addWidget(w)
        lay.addStretch(1)
        self.clear()

    def _muted_label(self) -> QLabel:
        label = QLabel()
        label.setWordWrap(True)
        label.setForegroundRole(QPalette.ColorRole.PlaceholderText)
        return label

    def _section(self, text: str) -> QLabel:
        label = QLabel(text)
        f = label.font()
        f.setBold(True)
        label.setFont(f)
        label.setContentsMargins(0, 8, 0, 0)
        return label

    def clear(self) -> None:
        self.info = None
        self.title.setText("<b>Distribution inspector</b>")
        self.where.setText("Click any token in the chat to see what the target (p) and the draft (q) thought at "
                           "its position.")
        for w in (self.note, self.verdict, self.gauge, self.overlap, self.pair_title, self.legend, self.pair,
                  self.residual_title, self.residual_note, self.residual):
            w.hide()

    def show_token(self, info: TokenInfo) -> None:
        self.clear()
        self.info = info
        ev, dist = info.event, info.dist
        self.title.setText(self._title_html(info))
        where = [f"round {info.round}", f"position {info.position + 1}"]
        if ev is not None:
            where.append(f"{ev.drafter} drafter, K {ev.k}" if ev.drafter else "plain decoding")
            where.append("greedy (T = 0)" if ev.temperature == 0 else f"T = {ev.temperature:g}")
        why = ev.reason if ev is not None else ""  # why this drafter drafted the round (the hybrid's policy)
        self.where.setText(" \u00b7 ".join(where) + (f"\n{why}" if why else ""))
        if dist is None:
            self._show(self.note, "This round carries no distribution data (recorded by an engine or trace without "
                                  "the inspector); the tooltip still gives p(t) and q(t).")
            return
        notes = []
        if dist.from_logits:
            notes.append("Greedy decoding: p and q are point masses at each model's argmax, so a draft is kept "
                         "exactly when both argmaxes agree. The bars show softmax(logits) at T = 1 instead (raw "
                         "logits, before any repetition penalty).")
        if ev is not None and ev.drafter == "ngram" and dist.q is not None:
            notes.append("The n-gram drafter proposes a point mass: q(t) = 1 on its token.")
        if notes:
            self._show(self.note, " ".join(notes))
        self._show_verdict(info, dist)
        if dist.tv is not None:
            self._show(self.overlap, f"TV(p, q) = <b>{dist.tv:.3f}</b> &nbsp;\u00b7&nbsp; \u03a3 min(p, q) = "
                                     f"1 \u2212 TV = <b>{dist.overlap:.3f}</b><br><span style='color:gray'>expected "
                                     "acceptance: the chance a draft from q passes here</span>")
        self._show_pairs(info, dist)
        if info.kind == Origin.CORRECTED.value and dist.residual:
            ev_draft = ev.drafted[info.position].text if ev is not None and info.position < len(ev.drafted) else ""
            self._show(self.residual_title)
            self._show(self.residual_note, f"The draft \u00ab{visible(ev_draft)}\u00bb was rejected, so the target "
                                           "drew its own token from what p has beyond q.")
            self._show(self.residual)
            self.residual.set_rows(residual_rows(dist, {i: "drawn" for i in dist.residual_ids if i == info.token_id}))

    def _show(self, widget: QWidget, text: str | None = None) -> None:
        if text is not None:
            widget.setText(text)
        widget.show()

    def _title_html(self, info: TokenInfo) -> str:
        if info.kind in (REJECTED, DISCARDED):
            hue, name = REJECTED_HUE, "Rejected draft" if info.kind == REJECTED else "Discarded draft"
        else:
            hue, name = ORIGIN_HUE[Origin(info.kind)], ORIGIN_LABEL[Origin(info.kind)]
        token = html.escape(_short(visible(info.text)))
        return (f"<span style='color:{hue}; font-size:large'>\u25a0</span> <b>{name}</b> &nbsp;"
                f"<span style='font-family:monospace'>\u00ab{token}\u00bb</span> "
                f"<span style='color:gray'>id {info.token_id}</span>")

    def _show_verdict(self, info: TokenInfo, dist: PositionDist) -> None:
        if info.kind not in DRAFTED or dist.u is None or info.p is None or info.q is None:
            return
        kept, words = verdict(dist.u, info.p, info.q)
        if info.kind == DISCARDED:
            words = (f"Never tested: an earlier draft of this round was rejected, so its draw u = {dist.u:.4f} went "
                     "unused.")
        else:
            words += (f"<br><span style='color:gray'>kept when u &lt; min(1, p/q) = {info.accept_prob:.4f} "
                      "(the green span)</span>")
        self._show(self.verdict, words)
        self.gauge.set_draw(dist.u, info.accept_prob or 0.0)
        self._show(self.gauge)

    def _show_pairs(self, info: TokenInfo, dist: PositionDist) -> None:
        ev = info.event
        marks = {info.token_id: "this"}
        if info.kind == Origin.CORRECTED.value and ev is not None and info.position < len(ev.drafted):
            marks.setdefault(ev.drafted[info.position].token_id, "rejected")
        if info.kind == REJECTED and ev is not None and info.position < len(ev.committed):
            marks.setdefault(ev.committed[info.position].token_id, "drawn")
        has_q = dist.q is not None
        what = "softmax(logits) at T = 1" if dist.from_logits else "after the sampling transforms"
        self._show(self.pair_title, f"Target p vs draft q \u2014 {what}" if has_q else f"Target p \u2014 {what}")
        swatch = "<span style='color:{}'>\u25ac</span> {}"
        legend = [swatch.format(P_HUE, "p target")] + ([swatch.format(Q_HUE, "q draft")] if has_q else [])
        self._show(self.legend, " &nbsp; ".join(legend))
        self.pair.hues = (P_HUE, Q_HUE) if has_q else (P_HUE,)
        rows = pair_rows(dist, marks)
        self.pair.set_rows([BarRow(r.label, r.values if has_q else r.values[:1], r.mark) for r in rows])
        self._show(self.pair)

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange and self.info is not None:
            self.show_token(self.info)


MIN_WIDTH = 300


class InspectorDock(QDockWidget):
    """The inspector as a side panel: hidden until a token is clicked, closable, movable."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Inspector", parent)
        self.setObjectName("inspector-dock")
        self.panel = InspectorPanel()
        scroll = QScrollArea()
        scroll.setWidget(self.panel)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        self.setWidget(scroll)
        # With the side panel, the charts and the chat beside it, the window must still fit a 1280-px screen: the
        # panel takes what room there is, and scrolls sideways below its natural width
        self.setMinimumWidth(MIN_WIDTH)
        self.hide()

    def show_token(self, info: TokenInfo) -> None:
        self.panel.show_token(info)
        self.show()
        self.raise_()

    def clear(self) -> None:
        self.panel.clear()
