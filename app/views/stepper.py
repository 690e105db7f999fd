"""Step-through: the paused round, phase by phase, and the keys that drive it.

With Run › Step through on, the engine waits after each phase of a round (engine/runtime/stepping.py): the draft has
proposed, the target has verified, the round is decided. `StepPanel` shows that phase's numbers (q, p and
min(1, p/q) per drafted position; the verdicts, the correction or bonus, and the rollback of both KV caches) and
shows the round's tokens provisionally at the end of the chat. Next runs one phase, Continue the rest of the
reply, Stop cancels it (the paused round finishes first). Only the engine process waits: the window stays live.
"""
from __future__ import annotations

import html

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QVBoxLayout,
    QWidget,
)

from app.views.chat_view import ChatView
from app.views.theme import OKABE_ITO, ORIGIN_HUE, REJECTED_HUE
from app.views.tokens import DISCARDED, PROVISIONAL, REJECTED, visible
from engine.api.events import CacheRollback, Origin, Phase, PhaseEvent

PHASE_TITLE = {
    Phase.DRAFTED: "1 / 3 \u00b7 Draft proposed",
    Phase.VERIFIED: "2 / 3 \u00b7 Target verified",
    Phase.DECIDED: "3 / 3 \u00b7 Accept / reject",
}
PHASE_NOTE = {
    Phase.DRAFTED: "The drafter proposed these tokens with probabilities q. The target has not seen them yet.",
    Phase.VERIFIED: "One target pass scored every drafted position: p beside q. Each draft passes with "
                    "probability min(1, p/q), in order, until the first rejection.",
    Phase.DECIDED: "Kept drafts, then the target's correction (drawn from norm(max(0, p \u2212 q))) or, when "
                   "every draft passed, a bonus token. Both caches roll back to the committed text.",
}


def phase_pieces(ev: PhaseEvent, show_rejected: bool = True) -> list[tuple[str, str]]:
    """What the chat shows provisionally for this phase, as ChatView.show_provisional pieces."""
    if ev.phase != Phase.DECIDED:
        return [(t, PROVISIONAL) for t in ev.texts]
    n = ev.accepted or 0
    out = [(t, Origin.ACCEPTED.value) for t in ev.texts[:n]]
    if show_rejected:
        out += [(t, REJECTED if i == n else DISCARDED) for i, t in enumerate(ev.texts) if i >= n]
    out += [(c.text, c.origin.value) for c in ev.committed if c.origin != Origin.ACCEPTED]
    return out


def verdict_of(ev: PhaseEvent, i: int) -> str:
    """The verdict on drafted position i, once decided ("" before)."""
    if ev.phase != Phase.DECIDED or ev.accepted is None:
        return ""
    return "accepted" if i < ev.accepted else "rejected" if i == ev.accepted else "discarded"


def rollback_line(r: CacheRollback) -> str:
    return (f"{r.cache.capitalize()} cache: {r.positions_before} \u2192 {r.positions_after} positions "
            f"({r.positions_freed} freed), {r.blocks_before} \u2192 {r.blocks_after} KV blocks "
            f"({r.blocks_freed} freed)")


def _num(v: float | None) -> str:
    return "\u2014" if v is None else f"{v:.3f}"


def phase_html(ev: PhaseEvent) -> str:
    """The phase as a rich-text table: one row per drafted position, then the round's last token."""
    verdict_hue = {"accepted": ORIGIN_HUE[Origin.ACCEPTED], "rejected": REJECTED_HUE, "discarded": OKABE_ITO["grey"]}
    head = "".join(f"<th align='{a}'>&nbsp;{h}&nbsp;</th>" for h, a in (
        ("#", "right"), ("token", "left"), ("q(t)", "right"), ("p(t)", "right"), ("min(1, p/q)", "right"),
        ("verdict", "left")))
    rows = []
    for i, text in enumerate(ev.texts):
        p = ev.p[i] if ev.p else None
        accept = None if p is None else (min(1.0, p / ev.q[i]) if ev.q[i] > 0 else 0.0)
        verdict = verdict_of(ev, i)
        mark = f"<span style='color:{verdict_hue[verdict]}'><b>{verdict}</b></span>" if verdict else ""
        rows.append(f"<tr><td align='right'>{i + 1}</td><td>&nbsp;<tt>{html.escape(visible(text))}</tt>&nbsp;</td>"
                    f"<td align='right'><tt>{_num(ev.q[i])}</tt></td><td align='right'><tt>{_num(p)}</tt></td>"
                    f"<td align='right'><tt>{_num(accept)}</tt></td><td>&nbsp;{mark}</td></tr>")
    for c in ev.committed:
        if c.origin == Origin.ACCEPTED:
            continue
        label = {Origin.CORRECTED: "correction", Origin.BONUS: "bonus", Origin.PLAIN: "plain decode"}[c.origin]
        rows.append(f"<tr><td align='right'>{c.index + 1}</td>"
                    f"<td>&nbsp;<tt>{html.escape(visible(c.text))}</tt>&nbsp;</td>"
                    f"<td></td><td align='right'><tt>{_num(c.p)}</tt></td><td></td>"
                    f"<td>&nbsp;<span style='color:{ORIGIN_HUE[c.origin]}'><b>{label}</b></span></td></tr>")
    table = f"<table cellspacing='0' cellpadding='2'><tr>{head}</tr>{''.join(rows)}</table>" if rows else ""
    caches = "<br>".join(html.escape(rollback_line(r)) for r in ev.rollback)
    return table + (f"<p style='margin-top:4px'>{caches}</p>" if caches else "")


class StepPanel(QFrame):
    """Shown while Step through is on: the paused phase and the Next / Continue / Stop buttons."""

    def __init__(self, controller, chat: ChatView, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.controller, self.chat = controller, chat
        self.setFrameShape(QFrame.Shape.StyledPanel)
        self.title = QLabel()
        font = self.title.font()
        font.setBold(True)
        self.title.setFont(font)
        self.title.setWordWrap(True)  # a long round title wraps instead of widening the window
        self.note = QLabel()
        self.note.setWordWrap(True)
        self.detail = QLabel()
        self.detail.setTextFormat(Qt.TextFormat.RichText)
        self.detail.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        # The phase's table is as wide as its drafts: it scrolls sideways in the chat's column, which it would
        # otherwise widen past the screen (with the inspector open, the window outgrew a 1600-px screen)
        self.detail_scroll = QScrollArea()
        self.detail_scroll.setWidget(self.detail)
        self.detail_scroll.setWidgetResizable(True)
        self.detail_scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.detail_scroll.setVerticalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)

        self.toggle_action = self._action("Step &through", "F9", "Pause after each phase of every round: draft, "
                                          "verify, accept/reject (F9)", checkable=True)
        self.next_action = self._action("&Next phase", "F10", "Run the paused round to its next phase (F10)")
        self.continue_action = self._action("C&ontinue", "F5", "Run the rest of this reply without pausing (F5)")
        self.toggle_action.toggled.connect(self.set_stepping)
        self.next_action.triggered.connect(controller.step)
        self.continue_action.triggered.connect(controller.resume)
        self.next_button = QPushButton("Next (F10)")
        self.next_button.clicked.connect(controller.step)
        self.continue_button = QPushButton("Continue (F5)")
        self.continue_button.clicked.connect(controller.resume)
        self.stop_button = QPushButton("Stop (Esc)")
        self.stop_button.clicked.connect(controller.stop)

        buttons = QHBoxLayout()  # under the title: beside it, a narrow chat column squeezed the title to a sliver
        buttons.addStretch(1)
        for b in (self.next_button, self.continue_button, self.stop_button):
            buttons.addWidget(b)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 6, 10, 8)
        lay.addWidget(self.title)
        lay.addLayout(buttons)
        lay.addWidget(self.note)
        lay.addWidget(self.detail_scroll)

        controller.phaseArrived.connect(self.show_phase)
        controller.roundsArrived.connect(lambda _events: chat.clear_provisional())
        controller.replyFinished.connect(self._on_finished)
        controller.chatCleared.connect(self._on_finished)
        controller.stateChanged.connect(self._update)
        self._idle()
        self.setVisible(False)
        self._update()

    def _action(self, text: str, key: str, tip: str, checkable: bool = False) -> QAction:
        a = QAction(text, self)
        a.setShortcut(QKeySequence(key))
        a.setToolTip(tip)
        a.setStatusTip(tip)
        a.setCheckable(checkable)
        return a

    def set_stepping(self, on: bool) -> None:
        self.controller.set_stepping(on)
        self.setVisible(on)
        if not on:
            self.chat.clear_provisional()
            self._idle()

    def show_phase(self, ev: PhaseEvent) -> None:
        what = f"{ev.drafter} drafter, K={ev.k}" if ev.drafter else "plain decode"
        self.title.setText(f"Round {ev.round} \u00b7 {PHASE_TITLE[ev.phase]}  ({what})")
        if ev.tokens:
            self.note.setText(PHASE_NOTE[ev.phase])
        else:
            self.note.setText("Nothing was drafted this round: the target decoded one token by itself.")
        if ev.reason:  # the hybrid's policy says why this drafter (or none) made the round
            self.note.setText(f"{self.note.text()}\n{ev.reason}")
        self.detail.setText(phase_html(ev))
        self.detail.setVisible(True)
        self.detail_scroll.setVisible(True)
        bar = self.detail_scroll.horizontalScrollBar().sizeHint().height()
        self.detail_scroll.setFixedHeight(self.detail.sizeHint().height() + bar)
        self.chat.show_provisional(phase_pieces(ev, self.chat.show_rejected))

    def _idle(self) -> None:
        self.title.setText("Step through")
        self.note.setText("Send a message: the engine pauses after each phase of every round "
                          "(draft \u2192 verify \u2192 accept/reject).")
        self.detail.clear()
        self.detail.setVisible(False)
        self.detail_scroll.setVisible(False)

    def _on_finished(self) -> None:
        self.chat.clear_provisional()
        self._idle()

    def _update(self) -> None:
        paused = self.controller.paused is not None
        for w in (self.next_action, self.continue_action, self.next_button, self.continue_button):
            w.setEnabled(paused)
        self.stop_button.setEnabled(self.controller.active is not None)
