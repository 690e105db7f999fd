"""The K tuner's window: progress and Cancel while the replays run, then measured speedup against K beside
Leviathan's curve, the best K marked, and one button that applies it to the K slider (app/session/tuner.py runs the
sweep, engine/analysis/sweep.py does the arithmetic)."""
from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QLabel,
    QProgressBar,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from app.session.names import drafter_name
from app.session.tuner import KTuner
from app.views.theme import OKABE_ITO, SERIES, mix
from engine.analysis.sweep import KS, Sweep, SweepRun

HUE = {"model": SERIES["measured"], "ngram": OKABE_ITO["blue"], "leviathan": SERIES["theoretical"],
       "plain": SERIES["plain"], "best": OKABE_ITO["orange"]}
NOISE = 1.05  # a best speedup under this is no clear win: single replays' rates vary by a few percent
# What a rate is, here and in every CSV column named tokens_per_s (engine/runtime/tally.py computes it)
RATE_DEFINITION = ("A rate is new tokens over the replay's time less both prompt prefills (the target's and the "
                   "draft's), the same definition as the CSV export's tokens_per_s.")
ONE_SAMPLE = ("one replay per K, and none accepted nothing, so the timing spread is unknown: a K a few percent "
              "ahead may be chance (run Tune K again to compare)")


def curve_points(sweep: Sweep, drafter: str) -> tuple[list[int], list[float]]:
    """K and measured speedup of one drafter's replays so far."""
    runs = [(r.k, sweep.speedup(r)) for r in sweep.series(drafter)]
    return [k for k, s in runs if s is not None], [s for _, s in runs if s is not None]


class TunerDialog(QDialog):
    applyRequested = Signal(str, int)  # drafter, K: the window sets its controls

    def __init__(self, controller, messages: list[dict[str, str]], sampling, spec, has_draft_model: bool,
                 parent: QWidget | None = None, ks=KS) -> None:
        super().__init__(parent)
        self.setWindowTitle("Tune K")
        self.resize(820, 600)
        self.sweep = Sweep(())
        self.complete = False
        self.tuner = KTuner(controller, messages, sampling, spec, has_draft_model, ks, self)
        self.tuner.progressed.connect(self._on_progress)
        self.tuner.runDone.connect(self._on_run)
        self.tuner.finished.connect(self._on_finished)

        temp = "greedy" if sampling.greedy else f"temperature {sampling.temperature:g}"
        drafters = "the draft model and the n-gram drafter" if has_draft_model else "the n-gram drafter"
        intro = QLabel(f"The last prompt replayed with plain decoding, then at K = {ks[0]}\u2026{ks[-1]} with "
                       f"{drafters}: seed {sampling.seed}, {temp}, {sampling.max_new_tokens} new tokens, each "
                       f"from an empty cache. Speedup is each replay's decode rate over plain decoding's. "
                       f"{RATE_DEFINITION}")
        intro.setWordWrap(True)
        intro.setObjectName("intro")
        self.plot = pg.PlotWidget()
        self.plot.setMenuEnabled(False)
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.hideButtons()
        self.plot.setLabel("bottom", "K (tokens drafted per round)")
        self.plot.setLabel("left", "speedup over plain (\u00d7)")
        self.plot.setXRange(0.5, ks[-1] + 0.5, padding=0)
        self.plot.getAxis("bottom").setTicks([[(k, str(k)) for k in ks]])
        text = self.palette().color(QPalette.ColorRole.Text)
        self.legend = self.plot.addLegend(offset=(10, -10), labelTextColor=text)  # bottom left: rarely data there
        self.plain_line = pg.InfiniteLine(pos=1.0, angle=0, movable=False,
                                          pen=pg.mkPen(HUE["plain"], width=1.5, style=Qt.PenStyle.DashLine))
        self.plot.addItem(self.plain_line)
        smooth = {"antialias": True}
        self.curves = {
            "leviathan": self.plot.plot(pen=pg.mkPen(HUE["leviathan"], width=2, style=Qt.PenStyle.DashLine),
                                        name="Leviathan (measured \u03b1, c)", **smooth),
            "model": self.plot.plot(pen=pg.mkPen(HUE["model"], width=2), symbol="o", symbolSize=8,
                                    symbolBrush=HUE["model"], symbolPen=None, name="draft model, measured",
                                    **smooth),
            "ngram": self.plot.plot(pen=pg.mkPen(HUE["ngram"], width=2), symbol="s", symbolSize=7,
                                    symbolBrush=HUE["ngram"], symbolPen=None, name="n-gram, measured", **smooth),
        }
        self.best_marker = pg.ScatterPlotItem(size=20, symbol="star", brush=pg.mkBrush(HUE["best"]),
                                              pen=pg.mkPen("#000000", width=1))
        self.plot.addItem(self.best_marker)
        self.best_label = pg.TextItem(anchor=(0.5, 1.3))
        self.plot.addItem(self.best_label)
        self.legend.addItem(pg.PlotDataItem(pen=pg.mkPen(HUE["plain"], width=1.5, style=Qt.PenStyle.DashLine)),
                            "plain decoding (1\u00d7)")

        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.status = QLabel("Starting\u2026")
        self.result = QLabel("")
        self.result.setWordWrap(True)
        self.result.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        buttons = QDialogButtonBox()
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("Stop the sweep after the current round, or the current chunk of a prompt "
                                      "being read")
        self.cancel_button.clicked.connect(self.cancel)
        self.apply_button = QPushButton("Apply best K")
        self.apply_button.setEnabled(False)
        self.apply_button.clicked.connect(self.apply_best)
        buttons.addButton(self.cancel_button, QDialogButtonBox.ButtonRole.ActionRole)
        buttons.addButton(self.apply_button, QDialogButtonBox.ButtonRole.ActionRole)
        close = buttons.addButton(QDialogButtonBox.StandardButton.Close)
        close.clicked.connect(self.close)

        lay = QVBoxLayout(self)
        lay.addWidget(intro)
        lay.addWidget(self.plot, 1)
        lay.addWidget(self.result)
        lay.addWidget(self.status)
        lay.addWidget(self.progress)
        lay.addWidget(buttons)
        self._restyle()

    def start(self) -> None:
        self.tuner.start()

    @property
    def running(self) -> bool:
        return self.tuner.running

    def cancel(self) -> None:
        """Say so at once: the running replay ends at its next round, or between chunks of a long prompt."""
        self.tuner.cancel()
        if not self.tuner.done:
            self.cancel_button.setEnabled(False)
            self.status.setText("Cancelling\u2026 the running replay stops at its next round, or at the next chunk of "
                                "the prompt it is reading.")

    # ---- tuner signals ---------------------------------------------------------------------------------------
    def _on_progress(self, done: float, total: int, label: str) -> None:
        self.progress.setValue(int(1000 * done / total) if total else 0)
        if not self.tuner.done and not self.tuner.cancelled:
            self.status.setText(f"Replay {min(int(done) + 1, total)} of {total}: {label}\u2026")

    def _on_run(self, _run: SweepRun) -> None:
        self.sweep = Sweep(tuple(self.tuner.runs))
        self.redraw()

    def _on_finished(self, sweep: Sweep, complete: bool) -> None:
        self.sweep, self.complete = sweep, complete
        self.cancel_button.setEnabled(False)
        self.redraw()
        best = sweep.best
        self.apply_button.setEnabled(best is not None)
        if best is not None:
            # One replay per K: without replays that accepted nothing, the timing spread is not measured
            sample = ", one replay" if sweep.noise is None else ""
            self.apply_button.setText(f"Apply K={best.k} ({drafter_name(best.drafter)}{sample})")
            self.apply_button.setToolTip(ONE_SAMPLE if sweep.noise is None else "")
        if complete:
            self.status.setText(f"Done: {len(sweep.runs)} replays. The sweep is in File \u203a Export session "
                                "stats (NAME_tuner.csv).")
        elif self.tuner.error:
            self.status.setText(f"Stopped: {self.tuner.error}")
        else:
            self.status.setText(f"Cancelled after {len(sweep.runs)} of {len(self.tuner.plan)} replays.")

    # ---- view ------------------------------------------------------------------------------------------------
    def redraw(self) -> None:
        s = self.sweep
        for drafter in ("model", "ngram"):
            xs, ys = curve_points(s, drafter)
            self.curves[drafter].setData(xs, ys)
        ks = np.array([k for _, k in self.tuner.plan if k], dtype=float)
        theory = [s.leviathan(int(k)) for k in sorted(set(ks))]
        if theory and theory[0] is not None:
            self.curves["leviathan"].setData(sorted(set(ks)), theory)
        best = s.best
        if best is not None:
            y = s.speedup(best)
            self.best_marker.setData([best.k], [y])
            self.best_label.setText(f"best: K={best.k}, {drafter_name(best.drafter)}, {y:.2f}\u00d7")
            self.best_label.setAnchor((1.0 if best.k > (self.tuner.plan[-1][1] + 1) / 2 else 0.0, 1.2))  # inside
            self.best_label.setPos(best.k, y)
        ys = [v for c in self.curves.values() for v in (c.yData if c.yData is not None else [])]
        self.plot.setYRange(0, max([1.2, *ys]) * 1.15, padding=0.04)  # a tick at the very top would be clipped
        self.result.setText(self.summary_text())

    def summary_text(self) -> str:
        s = self.sweep
        parts = []
        if s.plain is not None:
            parts.append(f"plain {s.plain.tokens_per_s:.1f} tok/s")
        if s.alpha is not None:
            parts.append(f"measured \u03b1 = {s.alpha:.2f}")
        if s.c is not None:
            parts.append(f"c = {s.c:.3f} (a draft step over a target step)")
        best = s.best
        if best is not None:
            parts.append(f"<b>best: {best.label}, {best.tokens_per_s:.1f} tok/s, {s.speedup(best):.2f}\u00d7</b>")
            noise = max(NOISE - 1.0, s.noise or 0.0)
            if s.speedup(best) - 1.0 <= noise:
                parts.append(f"within timing noise of plain decoding (\u00b1{noise:.0%}: replays that accepted "
                             "nothing spread that far): no K clearly pays for this prompt here")
            elif s.noise is None:
                parts.append(ONE_SAMPLE)
        return " \u00b7 ".join(parts)

    def apply_best(self) -> None:
        best = self.sweep.best
        if best is not None:
            self.applyRequested.emit(best.drafter, best.k)
            self.status.setText(f"Applied: {best.label}.")

    def _restyle(self) -> None:
        pal = self.palette()
        base, text = pal.color(QPalette.ColorRole.Base), pal.color(QPalette.ColorRole.Text)
        self.plot.setBackground(base)
        for side in ("left", "bottom"):
            ax = self.plot.getAxis(side)
            ax.setPen(pg.mkPen(mix(base, text, 0.55)))
            ax.setTextPen(pg.mkPen(mix(base, text, 0.8)))
        self.best_label.setColor(QColor(text))

    def closeEvent(self, event) -> None:  # noqa: N802 - Qt naming
        self.tuner.cancel()
        super().closeEvent(event)
