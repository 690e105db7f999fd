"""Live pyqtgraph panels over a per-round buffer.

`ChartBuffer` (app/views/chart_data.py) is plain Python: `feed()` appends one RoundEvent's numbers (called from
the GUI thread as events arrive). `ChartsPanel.flush()` redraws one plot from the buffer and is called by the window's
repaint timer (20 Hz). It does nothing when nothing changed, and it keeps the time its updates and paints take
under 3% of wall time (`TimeBudget`): on a machine with few cores that time is taken from the engine process's
threads, and as they meet at the end of every matmul, a preempted one stalls them all, so the engine loses about
what the window spends (scripts/profile/neighbour.py). On a fast machine every plot refreshes several times a second;
a slow one refreshes less often, never slower generation.

Speedup, measured vs theoretical (Leviathan et al.), each reply's own: the measured figure is the reply's
speculative tokens/s over its plain tokens/s, both in wall time (each round's time runs from the end of the one
before it, so catch-ups, sampling and rollback count; round 1, which reads the prompt, counts on neither side). The
plain side is the reply's plain steps: every 16 rounds the engine makes a run of three rounds of a chat reply plain
(app.controller.PLAIN_EVERY, engine.api.live.PLAIN_RUN), and all but each run's first are timed. A plain rate from
other minutes (an earlier reply, Run > Compare) never enters it: under a load that changes, the two would measure
different machines. Until the reply has timed a plain step the
figure is "—", with the reason in the tooltip.
theory = (1 - a^(K+1)) / ((1 - a)(1 + K c)), with a the reply's acceptance rate, K its mean number of tokens drafted
per drafting round, and c = (mean draft ms per drafted token) / (its plain step), or / (mean verify ms per round)
before it has one ("c≈"). When two drafters took turns (the hybrid), each has its own a, K and c, and the theory is
their rounds' mix. See engine.analysis.stats.SpeedTotals.

Every plot with more than one line has a legend; the titles say in plain words what is drawn, and the symbols and
counts behind them are in each plot's tooltip. Past RAW_ROUNDS rounds the per-round lines of acceptance and tokens/s
(a band of spikes by then) give way to a rolling mean over a wider window.

Layout: two columns of plots, or one scrolled column when the panel is too narrow for their titles (beside the
inspector); the speedup plot's y range leaves the formula's note a band of its own above the curves.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from typing import ClassVar

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QGraphicsItem, QScrollArea, QVBoxLayout, QWidget

from app.session.names import drafter_name
from app.views.chart_data import (
    NAN,
    ROLLING_WINDOW,
    ChartBuffer,
    TimeBudget,
    last_value,
    nice_ceiling,
    rolling_mean,
)
from app.views.theme import SERIES, mix
from engine.api.events import RoundEvent

TWO_COLUMNS_MIN_WIDTH = 540  # narrower, a two-column grid clips the titles ("Speedup 1.21x vs theory 1.35x")
PLOT_MIN_HEIGHT = 190  # in one column: the least height at which a plot still reads
POSITION_MIN_SAMPLES = 5  # below this many drafts a position's acceptance rate is mostly noise: its bar is faded
AXIS_WIDTH = 40
TITLE_MIN_WIDTH = 120
RAW_ROUNDS = 100  # past this many rounds a per-round line is a band of spikes: only the rolling mean is drawn
WIDE_WINDOW = 24  # the rolling mean's window then
NOTED_ERROR = 0.10  # from this relative standard error of the plain steps on, the speedup's title carries it


def _steady_title(label: pg.LabelItem, width: float) -> None:
    """A title asks for its text's size; ask for a fixed one instead. The titles change with the data (every
    draw), and a changed size hint re-lays out the whole grid, which re-renders all twelve axes in one paint
    (~50-100 ms on a 2-vCPU machine). A long title overflows its own plot instead of widening the grid."""
    compute = label.updateMin

    def update_min() -> None:
        compute()  # pyqtgraph fills label._sizeHint from the text, then asks the layout to update
        height = label.minimumHeight()
        label.setMinimumWidth(width)
        for hint in (Qt.SizeHint.MinimumSize, Qt.SizeHint.PreferredSize):
            label._sizeHint[hint] = (width, height)

    label.updateMin = update_min


def _span(key: str, text: str) -> str:
    return f"<span style='color:{SERIES[key]}'>{text}</span>"


class _View(pg.GraphicsLayoutWidget):
    """The plots' scene view; reports how long each paint took."""

    def __init__(self, parent: QWidget, on_paint) -> None:
        super().__init__(parent)
        self._on_paint = on_paint

    def paintEvent(self, ev) -> None:  # noqa: N802 - Qt naming
        t = time.perf_counter()
        super().paintEvent(ev)
        self._on_paint(time.perf_counter() - t)


class ChartsPanel(QWidget):
    """Six small plots in one GraphicsLayoutWidget (one scene, one repaint)."""

    CPU_SHARE = 0.03  # chart updates + paints may take 3% of wall time ...
    CPU_BURST = 0.03  # ... and 30 ms at once, after a pause

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        pg.setConfigOptions(antialias=False)  # per curve below: smooth lines only
        self.budget = TimeBudget(self.CPU_SHARE, self.CPU_BURST)
        self.buffer = ChartBuffer()
        self._drawn = [-1] * len(self.GROUPS)  # buffer version each plot shows
        self._group = -1
        self.repaints = 0
        self._shown: dict[tuple[str, str], object] = {}  # what each title / range shows now
        self._build_view()

        self.plots = self._build_plots()
        self._range("acceptance", "y", 0, 1.05)
        self._range("position", "y", 0, 1.05)
        self.curves, self.bars = self._build_curves()
        self._build_overlays()
        # Each plot's draw, by name (the full flush below draws every plot, so a missing one fails at once)
        self._drawers: dict[str, Callable[[ChartBuffer, np.ndarray, float], None]] = {
            "acceptance": self._draw_acceptance, "tokens": self._draw_tokens, "histogram": self._draw_histogram,
            "position": self._draw_position, "speedup": self._draw_speedup, "k": self._draw_k,
        }
        self._restyle()
        self.flush(full=True)

    def _build_plots(self) -> dict[str, pg.PlotItem]:
        """The six plots in their grid: fixed axes, no mouse, no menu; their axis labels."""
        plots: dict[str, pg.PlotItem] = {}
        for name, row, col in (("acceptance", 0, 0), ("tokens", 0, 1), ("histogram", 1, 0),
                               ("position", 1, 1), ("speedup", 2, 0), ("k", 2, 1)):
            p = self.view.addPlot(row=row, col=col)
            p.setMenuEnabled(False)
            p.setMouseEnabled(x=False, y=False)
            p.hideButtons()
            _steady_title(p.titleLabel, TITLE_MIN_WIDTH)
            # No grid: pyqtgraph draws it as part of each axis, across the whole plot, which doubles the cost
            # of every axis re-render. Axes repaint from a pixmap until their range changes, and no SI-prefix
            # relabelling re-lays them out when it does.
            for side in ("left", "bottom"):
                p.getAxis(side).setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
                p.getAxis(side).enableAutoSIPrefix(False)
            p.getAxis("left").setWidth(AXIS_WIDTH)  # fixed: new tick labels never re-layout the whole grid
            plots[name] = p
        for name in ("acceptance", "tokens", "speedup", "k"):
            plots[name].setLabel("bottom", "round")
        plots["histogram"].setLabel("bottom", "accepted drafts")
        plots["position"].setLabel("bottom", "draft position")
        return plots

    def _build_curves(self) -> tuple[dict[str, pg.PlotDataItem], dict[str, pg.BarGraphItem]]:
        """Each plot's lines and bars (curves by series name, bars by plot)."""

        def pen(key: str, width: float = 2.0, style=Qt.PenStyle.SolidLine) -> object:
            return pg.mkPen(SERIES[key], width=width, style=style)

        # Antialiasing only where it shows: the smooth lines. The jagged raw series and the steps skip it
        # (it roughly doubles their paint cost). Raw per-round values are thin lines, not scatter symbols:
        # a ScatterPlotItem rebuilds every spot in Python on each update.
        smooth = {"antialias": True}
        acc = self.plots["acceptance"]
        curves: dict[str, pg.PlotDataItem] = {
            "acceptance": acc.plot(pen=pen("acceptance", 1.0), connect="finite"),  # NaN: a plain round, a break
            "acceptance_mean": acc.plot(pen=pen("rolling"), connect="finite", **smooth),
            "tokens": self.plots["tokens"].plot(pen=pen("tokens", 1.0)),
            "tokens_mean": self.plots["tokens"].plot(pen=pen("rolling"), **smooth),
            "measured": self.plots["speedup"].plot(pen=pen("measured"), connect="finite", **smooth),
            "theoretical": self.plots["speedup"].plot(pen=pen("theoretical", 2.0, Qt.PenStyle.DashLine),
                                                      connect="finite", **smooth),
            "k": self.plots["k"].plot(pen=pen("k"), stepMode="left", connect="finite"),
            "drafted": self.plots["k"].plot(pen=pen("drafted", 1.0), connect="finite"),
        }
        bars = {
            "histogram": pg.BarGraphItem(x=[], height=[], width=0.8, brush=SERIES["histogram"], pen=None),
            "position": pg.BarGraphItem(x=[], height=[], width=0.8, brush=SERIES["position"], pen=None),
        }
        self.plots["histogram"].addItem(bars["histogram"])
        self.plots["position"].addItem(bars["position"])
        return curves, bars

    def _build_overlays(self) -> None:
        """The plain-step line, the speedup plot's note and the legends."""
        self.plain_line = pg.InfiniteLine(angle=0, movable=False,  # its value is in the plot's title
                                          pen=pg.mkPen(SERIES["plain"], width=1.5, style=Qt.PenStyle.DashLine))
        self.plain_line.setVisible(False)
        self.plots["tokens"].addItem(self.plain_line)
        # The formula's inputs, in the speedup plot's corner: a floating text item, which (unlike an axis label)
        # can change every draw without re-laying out the grid.
        self.speedup_note = pg.TextItem(anchor=(0, 0))
        self.speedup_note.setParentItem(self.plots["speedup"].vb)
        self.speedup_note.setPos(4, 2)
        # Wrapped to the plot's width: the hybrid's note has a line per drafter, and a narrow window cut lines off.
        vb = self.plots["speedup"].vb
        vb.sigResized.connect(self._on_speedup_resized)
        self._markers: list[tuple[pg.PlotItem, pg.InfiniteLine]] = []
        # A legend on every plot with more than one line, in its bottom right corner, one row
        self.legends: dict[str, pg.LegendItem] = {}
        self.legend_labels: dict[str, pg.LabelItem] = {}  # the entries whose text changes with the data
        self._plain_sample = pg.PlotDataItem(pen=self.plain_line.pen)
        self._left_out: set[str] = set()  # per-round curves not drawn (past RAW_ROUNDS), so not in their legend
        for name in self.LEGENDS:
            legend = pg.LegendItem(offset=(-4, -4), labelTextSize="8pt", horSpacing=8, verSpacing=-6)
            legend.setParentItem(self.plots[name].vb)
            self.legends[name] = legend
            self._fill_legend(name)

    # The legends' entries: (curve, label); "plain" is the tokens plot's dashed plain-step line
    LEGENDS: ClassVar[dict[str, tuple[tuple[str, str], ...]]] = {
        "acceptance": (("acceptance", "per round"), ("acceptance_mean", f"mean of {ROLLING_WINDOW} rounds")),
        "tokens": (("tokens", "per round"), ("tokens_mean", f"mean of {ROLLING_WINDOW} rounds"),
                   ("plain", "plain step")),
        "speedup": (("measured", "measured"), ("theoretical", "theory")),
        "k": (("k", "K (ceiling)"), ("drafted", "drafted")),
    }

    def _fill_legend(self, name: str) -> None:
        """The plot's legend, one row, without the curves that are left out."""
        legend = self.legends[name]
        legend.clear()
        entries = [(key, label) for key, label in self.LEGENDS[name] if key not in self._left_out]
        legend.setColumnCount(len(entries))
        for key, label in entries:
            legend.addItem(self._plain_sample if key == "plain" else self.curves[key], label)
            self.legend_labels[key] = legend.items[-1][1]
            if legend.opts.get("labelTextColor") is not None:
                legend.items[-1][1].setText(label, color=legend.opts["labelTextColor"])
            self._shown.pop((key, "legend"), None)  # a new label: its text is set again at the next draw

    def _legend_text(self, key: str, text: str) -> None:
        """A legend entry's new text, in the legends' colour (LabelItem.setText would reset it)."""
        legend = next(lg for lg in self.legends.values() if any(lb is self.legend_labels[key] for _, lb in lg.items))
        self.legend_labels[key].setText(text, color=legend.opts["labelTextColor"])

    def _leave_out(self, key: str, plot: str, out: bool) -> None:
        if (key in self._left_out) != out:
            (self._left_out.add if out else self._left_out.discard)(key)
            self._fill_legend(plot)

    # ---- layout ----------------------------------------------------------------------------------------------
    def _build_view(self) -> None:
        self.view = _View(self, self.budget.spend)
        self.view.ci.setContentsMargins(4, 4, 4, 4)
        self.view.ci.setSpacing(6)
        self.scroll = QScrollArea()  # scrolls only in one column (a narrow panel), where the plots keep a height
        self.scroll.setWidget(self.view)
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.scroll)
        self.columns = 2

    def resizeEvent(self, event) -> None:  # noqa: N802 - Qt naming
        super().resizeEvent(event)
        self._reflow(1 if self.width() < TWO_COLUMNS_MIN_WIDTH else 2)

    def _reflow(self, columns: int) -> None:
        """Two columns of plots when the panel is wide enough for their titles, else one, scrolled: squeezed
        beside the inspector, two columns clipped every title and pressed the plots flat."""
        if columns == self.columns:
            return
        self.columns = columns
        names = [name for group in self.GROUPS for name in group]
        for name in names:
            self.view.ci.removeItem(self.plots[name])
        for i, name in enumerate(names):
            self.view.ci.addItem(self.plots[name], row=i // columns, col=i % columns)
        self.view.setMinimumHeight(0 if columns == 2 else PLOT_MIN_HEIGHT * len(names))
        self._drawn = [-1] * len(self.GROUPS)  # every plot's size changed

    def _on_speedup_resized(self) -> None:
        vb = self.plots["speedup"].vb
        self.speedup_note.setTextWidth(max(vb.width() - 8, 60))  # wrapped: the hybrid's note has a line per drafter
        self._drawn[self.GROUPS.index(("speedup",))] = -1  # its headroom under the note depends on the height

    # ---- data in ---------------------------------------------------------------------------------------------
    def feed(self, ev: RoundEvent) -> None:
        self.buffer.feed(ev)

    def start_message(self) -> None:
        self.buffer.start_message()

    def clear(self) -> None:
        self.buffer.clear()
        self.flush(full=True)

    # ---- repaint ---------------------------------------------------------------------------------------------
    # The plots are drawn in turn, one per flush: each repaint then covers a sixth of the scene, which keeps
    # every single stretch of GUI-thread work short (the budget above bounds their total).
    GROUPS = (("acceptance",), ("tokens",), ("histogram",), ("position",), ("speedup",), ("k",))

    def flush(self, full: bool = False, budgeted: bool = True) -> bool:
        """Redraw the next plot that is behind the buffer, when the time budget allows (budgeted=False: even
        when it does not; full=True: all of them, budget or not). Returns whether it drew."""
        if budgeted and not full and not self.budget.allow():
            return False
        t = time.perf_counter()
        drew = False
        for _ in self.GROUPS:
            self._group = (self._group + 1) % len(self.GROUPS)
            if self._drawn[self._group] != self.buffer.version:
                self._draw(self._group)
                drew = True
                if not full:
                    break
        self.budget.spend(time.perf_counter() - t)
        return drew

    def _draw(self, group: int) -> None:
        b = self.buffer
        self._drawn[group] = b.version
        self.repaints += 1
        x = np.asarray(b.x, dtype=float)
        x_hi = max(nice_ceiling(len(x) + 1), 10.0)  # rounded ranges: axes re-render only now and then
        for name in self.GROUPS[group]:
            self._drawers[name](b, x, x_hi)
        self._sync_markers(group)

    @staticmethod
    def _mean_label(window: int) -> str:
        return f"mean of {window} rounds"

    def _window(self, rounds: int) -> int:
        """The rolling mean's window: wider once the per-round lines are no longer drawn."""
        return ROLLING_WINDOW if rounds <= RAW_ROUNDS else WIDE_WINDOW

    def _set_mean_label(self, key: str, window: int) -> None:
        label = self._mean_label(window)
        if self._shown.get((key, "legend")) != label:
            self._shown[(key, "legend")] = label
            self._legend_text(key, label)

    def _draw_acceptance(self, b: ChartBuffer, x: np.ndarray, x_hi: float) -> None:
        acc = np.asarray(b.acceptance, dtype=float)
        finite = np.isfinite(acc)
        # Plain rounds stay in, as NaN, so both lines break across them; a speculative round that drafted nothing
        # (the n-gram drafter found no match) is left out, and the line runs on over it.
        keep = finite | np.isnan(np.asarray(b.k, dtype=float))
        window = self._window(len(acc))
        mean = np.full(len(acc), NAN)
        mean[finite] = rolling_mean(acc[finite], window)
        raw = len(acc) <= RAW_ROUNDS
        self.curves["acceptance"].setData(x[keep] if raw else [], acc[keep] if raw else [])
        self.curves["acceptance"].setVisible(raw)
        self._leave_out("acceptance", "acceptance", not raw)
        self.curves["acceptance_mean"].setData(x[keep], mean[keep])
        self._set_mean_label("acceptance_mean", window)
        self._range("acceptance", "x", 0, x_hi)
        reply, chat = b.reply.drafting, b.totals.drafting
        alpha = f" \u00b7 {reply.alpha:.0%} this reply" if reply.drafted else ""
        self._title("acceptance", f"Drafts accepted{alpha}")
        self._tip("acceptance", "Acceptance rate \u03b1: the share of drafted tokens the target kept.\n"
                  + ("Thin line: each round; " if raw else f"Past {RAW_ROUNDS} rounds the per-round line is left out; ")
                  + f"thick line: the mean of the last {window} rounds that drafted.\n"
                  + (f"This reply: {reply.alpha:.0%} ({reply.accepted} of {reply.drafted} drafts). " if reply.drafted
                     else "This reply has drafted nothing yet. ")
                  + (f"This chat: {chat.alpha:.0%} ({chat.accepted} of {chat.drafted})." if chat.drafted else ""))

    def _draw_tokens(self, b: ChartBuffer, x: np.ndarray, x_hi: float) -> None:
        tps = np.asarray(b.tokens_per_s, dtype=float)
        raw = len(tps) <= RAW_ROUNDS
        window = self._window(len(tps))
        self.curves["tokens"].setData(x if raw else [], tps if raw else [])
        self.curves["tokens"].setVisible(raw)
        self._leave_out("tokens", "tokens", not raw)
        self.curves["tokens_mean"].setData(x, rolling_mean(tps, window))
        self._set_mean_label("tokens_mean", window)
        plain = b.plain_ms
        self.plain_line.setVisible(plain is not None)
        if plain:
            self.plain_line.setValue(1000.0 / plain)
        self._range("tokens", "x", 0, x_hi)
        top = max(float(tps.max()) if len(tps) else 0.0, 1000.0 / plain if plain else 0.0)
        self._range("tokens", "y", 0, nice_ceiling(top * 1.1))
        ref = f" \u00b7 {_span('plain', f'plain {1000.0 / plain:.1f}')} this reply" if plain else ""
        self._title("tokens", f"Tokens per second{ref}")
        passes = b.reply.step_passes
        self._tip("tokens", "Tokens each round committed over its own draft + verify time; the thick line is their "
                  f"mean over the last {window} rounds.\nDashed: plain decoding's rate now, one over the mean of this "
                  f"reply's one-row target passes ({passes} so far"
                  + (f", {plain:.1f} ms each" if plain else "") + "): a plain step timed in the same minutes.")

    def _draw_histogram(self, b: ChartBuffer, x: np.ndarray, x_hi: float) -> None:
        hist = np.asarray(b.accepted_len, dtype=float)
        if self._shown.get(("histogram", "data")) != b.accepted_len:
            self._shown[("histogram", "data")] = list(b.accepted_len)
            self.bars["histogram"].setOpts(x=np.arange(len(hist)), height=hist, width=0.8)
        self._range("histogram", "x", -0.6, max(len(hist), 2) - 0.4)
        self._integer_ticks("histogram", len(hist))
        self._range("histogram", "y", 0, nice_ceiling(float(hist.max()) * 1.1 if len(hist) else 1.0))
        self._title("histogram", "Drafts accepted in a round")
        self._tip("histogram", "How many rounds of this chat accepted 0, 1, 2\u2026 of their drafts.")

    def _draw_position(self, b: ChartBuffer, x: np.ndarray, x_hi: float) -> None:
        rates, counts = b.position_rates(), list(b.pos_drafted)
        if self._shown.get(("position", "data")) != (rates, counts):
            self._shown[("position", "data")] = (rates, counts)
            self.bars["position"].setOpts(x=np.arange(1, len(rates) + 1), height=np.asarray(rates), width=0.8,
                                          brushes=[self._position_brush(n) for n in counts])
        self._range("position", "x", 0.4, max(len(rates), 2) + 0.6)
        self._integer_ticks("position", len(rates))
        # One round at K = 16 drew sixteen bars at 1.0: the counts say how much each bar stands on
        n = f"n {counts[0]}" + (f"\u2013{counts[-1]}" if counts[-1] != counts[0] else "") if counts else ""
        few = any(c < POSITION_MIN_SAMPLES for c in counts)
        self._title("position", "Acceptance by draft position")
        self._tip("position", "The share of the 1st, 2nd, 3rd\u2026 drafted token of a round that the target kept, "
                  "this chat." + (f"\n{n}: the drafts behind the first and the last bar." if counts else "")
                  + (f"\nFaded bars stand on fewer than {POSITION_MIN_SAMPLES} drafts: mostly noise." if few else ""))

    @staticmethod
    def _position_brush(drafted: int) -> QColor:
        colour = QColor(SERIES["position"])
        if drafted < POSITION_MIN_SAMPLES:
            colour.setAlphaF(0.3)
        return colour

    def _draw_speedup(self, b: ChartBuffer, x: np.ndarray, x_hi: float) -> None:
        measured, theory = b.measured(), np.asarray(b.theoretical, dtype=float)
        m, th = b.reply.measured_speedup(), b.theory_now()
        # Both are running totals that hold still over plain rounds: kept in as NaN there, so the lines break
        # where the acceptance line does instead of running flat across a speculation-off reply.
        plain = np.isnan(np.asarray(b.k, dtype=float))
        measured[plain], theory[plain] = NAN, NAN
        keep = np.isfinite(measured) | plain
        self.curves["measured"].setData(x[keep], measured[keep])
        self.curves["theoretical"].setData(x, theory)
        figure = _span("measured", f"{m:.2f}\u00d7" if m is not None else "\u2014")
        err = b.reply.plain_wall.relative_error if m is not None else None
        if err is not None and err >= NOTED_ERROR:  # a loose basis says so where the figure is read
            figure += f" \u00b1{err:.0%}"
        self._title("speedup", f"Speedup {figure} vs plain measured this reply")
        label = f"theory {th:.2f}\u00d7" if th is not None else "theory"
        if self._shown.get(("theoretical", "legend")) != label:
            self._shown[("theoretical", "legend")] = label
            self._legend_text("theoretical", label)
        self._tip("speedup", self._speedup_tip(b, m))
        inputs = self._speedup_inputs(b)
        if self._shown.get(("speedup", "note")) != inputs:
            self._shown[("speedup", "note")] = inputs
            self.speedup_note.setText(inputs)
        both = np.concatenate([measured, theory])
        top = float(np.nanmax(both)) if np.isfinite(both).any() else 1.0
        self._range("speedup", "x", 0, x_hi)
        self._range("speedup", "y", 0, self._below_note(top))

    @staticmethod
    def _speedup_tip(b: ChartBuffer, m: float | None) -> str:
        r = b.reply
        if m is not None:
            spec, plain = r.spec_wall, r.plain_wall
            e = plain.relative_error
            err = ("" if e is None else f"; from so few steps, whose times vary, the plain rate and so the speedup "
                   f"are uncertain by \u00b1{e:.0%} (one standard error); Run \u203a Compare times a plain step for "
                   "every token")
            basis = (f"Measured, in wall time: this reply's speculative rounds, {spec.committed} tokens in "
                     f"{spec.seconds:.1f} s ({spec.tokens_per_s:.1f} tok/s), against its {plain.rounds} timed plain "
                     f"step{'s' if plain.rounds != 1 else ''} (a run's first, after speculative rounds, is not timed: "
                     "under load it ran faster than plain decoding does), "
                     f"{plain.committed} tokens in {plain.seconds:.2f} s ({plain.tokens_per_s:.1f} tok/s){err}. Each "
                     "round's time runs from the end of the round before it, so the draft model's catch-ups, "
                     "sampling and rollback are in; the first round (it reads the prompt) is in neither.")
        elif not r.spec_wall.rounds:
            basis = "Measured: \u2014, this reply has no timed speculative round yet (its first reads the prompt)."
        else:
            basis = ("Measured: \u2014, this reply has timed no plain step yet, and a plain rate from other minutes "
                     "(another reply, a Compare) would measure a differently loaded machine. A chat reply runs three "
                     "in a row every 16 rounds and times the second and third; Run \u203a Compare gives the paired "
                     "A/B.")
        return (basis + "\nTheory (Leviathan): (1 \u2212 \u03b1^(K+1)) / ((1 \u2212 \u03b1)(1 + K\u00b7c)), with "
                "\u03b1 the acceptance rate, K the tokens drafted per round and c one draft step's cost in target "
                "steps, all this reply's; per drafter under the hybrid. c\u2248: no plain step timed yet, the verify "
                "pass stands in for one.")

    def _below_note(self, top: float) -> float:
        """A y range whose data stays under the note in the plot's top left corner: the note sits over every x
        (a curve peaks early as often as late), so the headroom is taken from the top of the range."""
        vb_height = self.plots["speedup"].vb.height()
        note = self.speedup_note.boundingRect().height() + 6 if self._shown.get(("speedup", "note")) else 0.0
        free = 1.0 - note / vb_height if vb_height > 0 else 1.0
        return max(nice_ceiling(top * 1.1 / max(free, 0.2)), 2.0)

    @staticmethod
    def _speedup_inputs(b: ChartBuffer) -> str:
        """The formula's inputs for this reply, per drafter under the hybrid (the symbols: the plot's tooltip)."""
        t = b.reply
        if not t.drafting.rounds:
            return ""
        ref = t.reference_ms()
        c_word = "c " if b.plain_ms else "c\u2248"
        named = len(t.by_drafter) > 1  # the hybrid: one line per drafter
        lines = [f"{drafter_name(name) + ': ' if named else ''}\u03b1 {d.alpha:.2f}  K {d.mean_k:.1f}  "
                 f"{c_word}{d.cost_ratio(ref):.2f}" for name, d in t.by_drafter.items()]
        return "\n".join(lines) + " \u00b7 this reply"  # the scope, as the acceptance title gives it

    def _draw_k(self, b: ChartBuffer, x: np.ndarray, x_hi: float) -> None:
        ks = np.asarray(b.k, dtype=float)
        self.curves["k"].setData(x, ks)
        self.curves["drafted"].setData(x, np.asarray(b.drafted, dtype=float))
        self._range("k", "x", 0, x_hi)
        self._range("k", "y", 0, (np.nanmax(ks) if np.isfinite(ks).any() else 4.0) + 1)
        k = last_value(b.k)
        self._title("k", "Draft length per round" + (f" \u00b7 K {k:.0f}" if k is not None else ""))
        self._tip("k", "K: the most tokens a round may draft (the K setting, or adaptive K's choice). Drafted: how "
                  "many it did draft; fewer when the draft model stopped early, unsure, or the n-gram lookup found "
                  "fewer. Breaks: plain rounds.")

    def _range(self, name: str, axis: str, lo: float, hi: float) -> None:
        if self._shown.get((name, axis)) != (lo, hi):
            self._shown[(name, axis)] = (lo, hi)
            plot = self.plots[name]
            (plot.setXRange if axis == "x" else plot.setYRange)(lo, hi, padding=0)

    def _tip(self, name: str, text: str) -> None:
        """The plot's tooltip (the scene shows it anywhere over the plot)."""
        if self._shown.get((name, "tip")) != text:
            self._shown[(name, "tip")] = text
            self.plots[name].setToolTip(text)

    def _integer_ticks(self, name: str, n: int) -> None:
        """Whole-number ticks on a count axis (every other one past 8)."""
        step = 1 if n <= 8 else 2
        if self._shown.get((name, "ticks")) != step:
            self._shown[(name, "ticks")] = step
            self.plots[name].getAxis("bottom").setTickSpacing(step, step)

    def _title(self, name: str, text: str) -> None:
        if self._shown.get((name, "title")) != text:
            self._shown[(name, "title")] = text
            self.plots[name].setTitle(text, size="9pt", color=self._title_colour)

    def _sync_markers(self, group: int) -> None:
        """Dotted lines where each message after the first starts, on the group's per-round plots."""
        names = [n for n in self.GROUPS[group] if n in ("acceptance", "tokens", "speedup", "k")]
        want = [s for s in self.buffer.message_starts if s > 1]
        mine = [(p, line) for p, line in self._markers if p in (self.plots[n] for n in names)]
        if len(mine) == len(want) * len(names):
            return
        for plot, line in mine:
            plot.removeItem(line)
            self._markers.remove((plot, line))
        base, text = self.palette().color(QPalette.ColorRole.Base), self.palette().color(QPalette.ColorRole.Text)
        pen = pg.mkPen(mix(base, text, 0.3), width=1, style=Qt.PenStyle.DotLine)
        for s in want:
            for name in names:
                line = pg.InfiniteLine(pos=s - 0.5, angle=90, pen=pen)
                self.plots[name].addItem(line)
                self._markers.append((self.plots[name], line))

    # ---- look ------------------------------------------------------------------------------------------------
    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange:
            self._restyle()

    def _restyle(self) -> None:
        pal = self.palette()
        base, text = pal.color(QPalette.ColorRole.Base), pal.color(QPalette.ColorRole.Text)
        self.view.setBackground(base)
        axis_pen = pg.mkPen(mix(base, text, 0.55))
        for p in self.plots.values():
            for side in ("left", "bottom"):
                ax = p.getAxis(side)
                ax.setPen(axis_pen)
                ax.setTextPen(pg.mkPen(mix(base, text, 0.8)))
        self._title_colour = QColor(text).name()
        self.speedup_note.setColor(mix(base, text, 0.7))
        backdrop = QColor(base)
        backdrop.setAlphaF(0.8)  # over a curve that runs under it, the legend still reads
        for legend in self.legends.values():
            legend.setBrush(pg.mkBrush(backdrop))
            legend.setPen(pg.mkPen(mix(base, text, 0.25)))
            legend.setLabelTextColor(mix(base, text, 0.8))
            for _, label in legend.items:  # the labels already there take the colour at their next setText
                label.setText(label.text, color=legend.opts["labelTextColor"])
        self._shown = {k: v for k, v in self._shown.items() if k[1] not in ("title", "label")}
        for plot, line in self._markers:
            plot.removeItem(line)
        self._markers.clear()
        self._drawn = [-1] * len(self.GROUPS)
