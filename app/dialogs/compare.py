"""A/B: replay one prompt with speculation off, then on, with the same seed and sampling settings.

Under greedy decoding the two replies must be identical token for token (speculative decoding is lossless);
at temperature > 0 they share a distribution, not necessarily a sample. Both runs go through the window's
ChatController, which records them in the session stats; the dialog only shows them.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QGridLayout,
    QLabel,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.session.names import drafter_name
from app.session.verdict import Verdict, compare
from app.views.chat_view import ChatView
from app.views.theme import OKABE_ITO
from engine.analysis.stats import MessageRecord
from engine.api.config import SamplingParams, SpecParams
from engine.api.events import RoundEvent, Summary


@dataclass
class Side:
    title: str
    kind: str  # the stats record kind
    spec: SpecParams
    view: ChatView
    stats_label: QLabel
    request_id: int | None = None
    record: MessageRecord | None = None
    summary: Summary | None = None
    error: str | None = None
    done: bool = False


class CompareDialog(QDialog):
    completed = Signal(object)  # Verdict, or None when a side failed or was cancelled

    def __init__(self, controller, messages: list[dict[str, str]], sampling: SamplingParams, spec: SpecParams,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Compare: speculation off vs on")
        self.resize(1100, 640)
        self.controller = controller
        self.messages, self.sampling = messages, sampling
        self.prompt = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
        self.verdict: Verdict | None = None

        drafter = drafter_name(spec.drafter)
        k = "adaptive K" if spec.adaptive else f"K={spec.k}"
        grid = QGridLayout()
        self.sides: list[Side] = []
        for col, (title, kind, sp) in enumerate((
            ("Speculation off (plain decoding)", "compare-plain", spec.with_(enabled=False)),
            (f"Speculation on ({drafter}, {k})", "compare-speculative", spec.with_(enabled=True)),
        )):
            head = QLabel(f"<b>{title}</b>")
            view = ChatView()
            view.setPlaceholderText("Waiting\u2026")
            stats_label = QLabel("\u2014")
            stats_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            grid.addWidget(head, 0, col)
            grid.addWidget(view, 1, col)
            grid.addWidget(stats_label, 2, col)
            self.sides.append(Side(title, kind, sp, view, stats_label))
        grid.setRowStretch(1, 1)

        seed = "random" if sampling.seed is None else str(sampling.seed)
        temp = "greedy" if sampling.greedy else f"temperature {sampling.temperature:g}, top-p {sampling.top_p:g}"
        self.settings_label = QLabel(f"Same prompt, same settings: {temp}, seed {seed}, "
                                     f"max {sampling.max_new_tokens} new tokens.")
        self.settings_label.setWordWrap(True)
        self.verdict_label = QLabel("Running plain decoding first\u2026")
        self.verdict_label.setWordWrap(True)
        self.verdict_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        font = self.verdict_label.font()
        font.setPointSizeF(font.pointSizeF() * 1.1)
        self.verdict_label.setFont(font)

        buttons = QDialogButtonBox()
        self.stop_button = QPushButton("Stop")
        self.stop_button.clicked.connect(self.stop)
        buttons.addButton(self.stop_button, QDialogButtonBox.ButtonRole.ActionRole)
        close = buttons.addButton(QDialogButtonBox.StandardButton.Close)
        close.clicked.connect(self.close)

        lay = QVBoxLayout(self)
        lay.addWidget(self.settings_label)
        lay.addLayout(grid, 1)
        lay.addWidget(self.verdict_label)
        lay.addWidget(buttons)

        self._timer = QTimer(self)
        self._timer.setInterval(50)
        self._timer.timeout.connect(self._flush)

    def start(self) -> None:
        for side in self.sides:
            side.view.begin_assistant(title=None)
            req = self.controller.submit(self.messages, self.sampling, side.spec, side.kind, self.prompt)
            side.request_id, side.record = req.id, req.record
            # The handle holds these slots: they name the side, which does not hold the handle
            req.handle.rounds.connect(partial(self._on_rounds, side))
            req.handle.summary.connect(partial(self._on_summary, side))
            req.handle.errored.connect(partial(self._on_error, side))
            req.handle.finished.connect(partial(self._on_finished, side))
        self._timer.start()

    def stop(self) -> None:
        for side in self.sides:
            if side.request_id is not None:
                self.controller.cancel(side.request_id)

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt naming
        self.stop()
        super().closeEvent(event)

    @property
    def running(self) -> bool:
        return any(not s.done for s in self.sides)

    def _on_rounds(self, side: Side, events: list[RoundEvent]) -> None:
        for ev in events:
            side.view.feed(ev)
        if side is self.sides[1] and len(side.record.rounds) == len(events):  # its first rounds
            self.verdict_label.setText("Now with speculation\u2026")

    def _on_summary(self, side: Side, s: Summary) -> None:
        side.summary = s
        side.view.finish(f"{s.new_tokens} tokens, {s.rounds} rounds, stop: {s.stop_reason}")
        acc = f" \u00b7 acceptance {s.acceptance_rate:.0%} (this replay)" if s.drafted else ""
        side.stats_label.setText(f"{s.tokens_per_s:.1f} tok/s \u00b7 {s.new_tokens} tokens \u00b7 "
                                 f"{s.mean_tokens_per_round:.2f} tokens/round{acc}")

    def _on_error(self, side: Side, message: str) -> None:
        side.error = message
        side.stats_label.setText(f"Failed: {message}")

    def _on_finished(self, side: Side) -> None:
        side.done = True
        if self.running:
            return
        self._flush()
        self._timer.stop()
        self.stop_button.setEnabled(False)
        a, b = (s.summary for s in self.sides)
        if a is None or b is None or "cancelled" in (a.stop_reason, b.stop_reason):
            errors = [f"{s.title}: {s.error}" for s in self.sides if s.error]
            self.verdict_label.setText("Comparison incomplete. " + (" ".join(errors) or "It was stopped."))
            self.completed.emit(None)
            return
        self.verdict = compare(a, b, self.sampling.greedy)
        colour = OKABE_ITO["bluish_green"] if self.verdict.ok else OKABE_ITO["vermillion"]
        mark = "\u2714" if self.verdict.identical else ("\u2716" if self.verdict.greedy else "\u2260")
        self.verdict_label.setText(f"<span style='color:{colour}'>{mark}</span> <b>{self.verdict.text}</b><br>"
                                   f"<small>{self.verdict.note}</small>")
        self.completed.emit(self.verdict)

    def _flush(self) -> None:
        for side in self.sides:
            side.view.flush()
