"""Live pyqtgraph panels over a per-round buffer.

`ChartBuffer` (app/views/chart_data.py) is plain Python: `feed()` appends one RoundEvent's numbers (called from
the GUI thread as events arrive). `ChartsPanel.flush()` redraws one plot from the buffer and is called by the window's
repaint timer (20 Hz). It does nothing when nothing changed, and it keeps the time its updates and paints take
under 3% of wall time (`TimeBudget`): on a machine with few cores that time is taken from the engine process's
threads, and as they meet at the end of every matmul, a preempted one stalls them all, so the engine loses about
what the window spends (scripts/profile/neighbour.py). On a fast machine every plot refreshes several times a second;
a slow one refreshes less often, never slower generation.

Speedup, measured vs theoretical (Leviathan et al.): theory = (1 - a^(K+1)) / ((1 - a)(1 + K c)), with a the
measured acceptance rate, K the mean number of tokens drafted per drafting round, and
c = (mean draft ms per drafted token) / (mean plain-decode ms per token) once the session has a plain rate
(any round with speculation off, e.g. from Run > Compare), else / (mean verify ms per round). When two drafters
took turns (the hybrid), each has its own a, K and c, and the theory is their rounds' mix. The measured
figure is speculative tokens/s over plain tokens/s, and only that: before the session has a plain rate the panel
says it needs one instead of showing an estimate (a stand-in that could exceed the bound it is compared with).
When a plain rate arrives, the whole measured curve is drawn from it and the theory curve is redone under it, so
a trace reopened later shows the same figures. See engine.analysis.stats.SpeedTotals.

Layout: two columns of plots, or one scrolled column when the panel is too narrow for their titles (beside the
inspector); the speedup plot's y range leaves the formula's note a band of its own above the curves.
"""
from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QEvent, Qt
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QGraphicsItem, QScrollArea, QVBoxLayout, QWidget

from app.session.names import drafter_name
from app.views.chart_data import NAN, ChartBuffer, TimeBudget, last_value, nice_ceiling, rolling_mean
from app.views.theme import SERIES, mix
from engine.api.events import RoundEvent

TWO_COLUMNS_MIN_WIDTH = 540  # narrower, a two-column grid clips the titles ("Speedup 1.21x vs theory 1.35x")
PLOT_MIN_HEIGHT = 190  # in one column: the least height at which a plot still reads
POSITION_MIN_SAMPLES = 5  # below this many drafts a position's acceptance rate is mostly noise: its bar is faded
AXIS_WIDTH = 40
TITLE_MIN_WIDTH = 120


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

        self.plots: dict[str, pg.PlotItem] = {}
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
            self.plots[name] = p
        self._range("acceptance", "y", 0, 1.05)
        self._range("position", "y", 0, 1.05)
        for name in ("acceptance", "tokens", "speedup", "k"):
            self.plots[name].setLabel("bottom", "round")
        self.plots["histogram"].setLabel("bottom", "accepted drafts")
        self.plots["position"].setLabel("bottom", "draft position")

        def pen(key: str, width: float = 2.0, style=Qt.PenStyle.SolidLine) -> object:
            return pg.mkPen(SERIES[key], width=width, style=style)

        # Antialiasing only where it shows: the smooth lines. The jagged raw series and the steps skip it
        # (it roughly doubles their paint cost). Raw per-round values are thin lines, not scatter symbols:
        # a ScatterPlotItem rebuilds every spot in Python on each update.
        smooth = {"antialias": True}
        acc = self.plots["acceptance"]
        self.curves: dict[str, pg.PlotDataItem] = {
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
        self.bars = {
            "histogram": pg.BarGraphItem(x=[], height=[], width=0.8, brush=SERIES["histogram"], pen=None),
            "position": pg.BarGraphItem(x=[], height=[], width=0.8, brush=SERIES["position"], pen=None),
        }
        self.plots["histogram"].addItem(self.bars["histogram"])
        self.plots["position"].addItem(self.bars["position"])
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
        # Each plot's draw, by name (the full flush below draws every plot, so a missing one fails at once)
        self._drawers: dict[str, Callable[[ChartBuffer, np.ndarray, float], None]] = {
            "acceptance": self._draw_acceptance, "tokens": self._draw_tokens, "histogram": self._draw_histogram,
            "position": self._draw_position, "speedup": self._draw_speedup, "k": self._draw_k,
        }
        self._restyle()
        self.flush(full=True)

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

    def set_plain_reference(self, ms_per_token: float | None) -> None:
        self.buffer.set_plain_reference(ms_per_token)

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

    def _draw_acceptance(self, b: ChartBuffer, x: np.ndarray, x_hi: float) -> None:
        acc = np.asarray(b.acceptance, dtype=float)
        finite = np.isfinite(acc)
        # Plain rounds stay in, as NaN, so both lines break across them; a speculative round that drafted nothing
        # (the n-gram drafter found no match) is left out, and the line runs on over it.
        keep = finite | np.isnan(np.asarray(b.k, dtype=float))
        mean = np.full(len(acc), NAN)
        mean[finite] = rolling_mean(acc[finite])
        self.curves["acceptance"].setData(x[keep], acc[keep])
        self.curves["acceptance_mean"].setData(x[keep], mean[keep])
        self._range("acceptance", "x", 0, x_hi)
        t = b.totals
        alpha = f" \u00b7 \u03b1 {t.drafting.alpha:.0%}" if t.drafting.drafted else ""
        self._title("acceptance", f"Acceptance ({_span('rolling', 'mean')}){alpha}")

    def _draw_tokens(self, b: ChartBuffer, x: np.ndarray, x_hi: float) -> None:
        tps = np.asarray(b.tokens_per_s, dtype=float)
        self.curves["tokens"].setData(x, tps)
        self.curves["tokens_mean"].setData(x, rolling_mean(tps))
        plain = b.plain_ms
        self.plain_line.setVisible(plain is not None)
        if plain:
            self.plain_line.setValue(1000.0 / plain)
        self._range("tokens", "x", 0, x_hi)
        top = max(float(tps.max()) if len(tps) else 0.0, 1000.0 / plain if plain else 0.0)
        self._range("tokens", "y", 0, nice_ceiling(top * 1.1))
        ref = f" \u00b7 {_span('plain', f'plain {1000.0 / plain:.1f}')}" if plain else ""
        self._title("tokens", f"Tokens/s ({_span('rolling', 'mean')}){ref}")

    def _draw_histogram(self, b: ChartBuffer, x: np.ndarray, x_hi: float) -> None:
        hist = np.asarray(b.accepted_len, dtype=float)
        if self._shown.get(("histogram", "data")) != b.accepted_len:
            self._shown[("histogram", "data")] = list(b.accepted_len)
            self.bars["histogram"].setOpts(x=np.arange(len(hist)), height=hist, width=0.8)
        self._range("histogram", "x", -0.6, max(len(hist), 2) - 0.4)
        self._integer_ticks("histogram", len(hist))
        self._range("histogram", "y", 0, nice_ceiling(float(hist.max()) * 1.1 if len(hist) else 1.0))
        self._title("histogram", "Accepted per round")

    def _draw_position(self, b: ChartBuffer, x: np.ndarray, x_hi: float) -> None:
        rates, counts = b.position_rates(), list(b.pos_drafted)
        if self._shown.get(("position", "data")) != (rates, counts):
            self._shown[("position", "data")] = (rates, counts)
            self.bars["position"].setOpts(x=np.arange(1, len(rates) + 1), height=np.asarray(rates), width=0.8,
                                          brushes=[self._position_brush(n) for n in counts])
        self._range("position", "x", 0.4, max(len(rates), 2) + 0.6)
        self._integer_ticks("position", len(rates))
        # One round at K = 16 drew sixteen bars at 1.0: the counts say how much each bar stands on
        n = f" \u00b7 n {counts[0]}" + (f"\u2013{counts[-1]}" if counts[-1] != counts[0] else "") if counts else ""
        few = f", faded &lt; {POSITION_MIN_SAMPLES}" if any(c < POSITION_MIN_SAMPLES for c in counts) else ""  # HTML
        self._title("position", f"Accepted by position{n}{few}")

    @staticmethod
    def _position_brush(drafted: int) -> QColor:
        colour = QColor(SERIES["position"])
        if drafted < POSITION_MIN_SAMPLES:
            colour.setAlphaF(0.3)
        return colour

    def _draw_speedup(self, b: ChartBuffer, x: np.ndarray, x_hi: float) -> None:
        measured, theory = b.measured(), np.asarray(b.theoretical, dtype=float)
        m, th = last_value(list(measured)), b.theory_now()
        # Both are running totals that hold still over plain rounds: kept in as NaN there, so the lines break
        # where the acceptance line does instead of running flat across a speculation-off reply.
        plain = np.isnan(np.asarray(b.k, dtype=float))
        measured[plain], theory[plain] = NAN, NAN
        keep = np.isfinite(measured) | plain
        self.curves["measured"].setData(x[keep], measured[keep])
        self.curves["theoretical"].setData(x, theory)
        ts = _span("theoretical", f"theory {th:.2f}\u00d7" if th is not None else "theory")
        if b.plain_ms:
            ms = _span("measured", f"{m:.2f}\u00d7" if m is not None else "measured")
            self._title("speedup", f"Speedup {ms} vs {ts}")
        else:
            self._title("speedup", f"Speedup: {ts}")
        inputs = self._speedup_inputs(b)
        if self._shown.get(("speedup", "note")) != inputs:
            self._shown[("speedup", "note")] = inputs
            self.speedup_note.setText(inputs)
        both = np.concatenate([measured, theory])
        top = float(np.nanmax(both)) if np.isfinite(both).any() else 1.0
        self._range("speedup", "x", 0, x_hi)
        self._range("speedup", "y", 0, self._below_note(top))

    def _below_note(self, top: float) -> float:
        """A y range whose data stays under the note in the plot's top left corner: the note sits over every x
        (a curve peaks early as often as late), so the headroom is taken from the top of the range."""
        vb_height = self.plots["speedup"].vb.height()
        note = self.speedup_note.boundingRect().height() + 6 if self._shown.get(("speedup", "note")) else 0.0
        free = 1.0 - note / vb_height if vb_height > 0 else 1.0
        return max(nice_ceiling(top * 1.1 / max(free, 0.2)), 2.0)

    @staticmethod
    def _speedup_inputs(b: ChartBuffer) -> str:
        """The formula's inputs, per drafter under the hybrid, and what the measured figure needs."""
        t = b.totals
        inputs = ""
        if t.drafting.rounds:
            # Without a plain rate, c divides by the verify pass instead of a plain step: say so.
            ref = t.reference_ms(b.plain_ms)
            c_word = "c " if b.plain_ms else "c\u2248"
            named = len(t.by_drafter) > 1  # the hybrid: one line per drafter
            lines = [f"{drafter_name(name) + ': ' if named else ''}\u03b1 {d.alpha:.2f}  K {d.mean_k:.1f}  "
                     f"{c_word}{d.cost_ratio(ref):.2f}" for name, d in t.by_drafter.items()]
            if not b.plain_ms and named:
                lines.append("(c\u2248: verify as step)")
            elif not b.plain_ms:
                lines[0] += " (verify as step)"
            inputs = "\n".join(lines)
        if t.spec_rounds and not b.plain_ms:
            inputs += "\nmeasured speedup: needs a plain run \u2014 Run \u203a Compare"
        return inputs

    def _draw_k(self, b: ChartBuffer, x: np.ndarray, x_hi: float) -> None:
        ks = np.asarray(b.k, dtype=float)
        self.curves["k"].setData(x, ks)
        self.curves["drafted"].setData(x, np.asarray(b.drafted, dtype=float))
        self._range("k", "x", 0, x_hi)
        self._range("k", "y", 0, (np.nanmax(ks) if np.isfinite(ks).any() else 4.0) + 1)
        k = last_value(b.k)
        self._title("k", "K and drafted per round" + (f" \u00b7 {k:.0f}" if k is not None else ""))

    def _range(self, name: str, axis: str, lo: float, hi: float) -> None:
        if self._shown.get((name, axis)) != (lo, hi):
            self._shown[(name, axis)] = (lo, hi)
            plot = self.plots[name]
            (plot.setXRange if axis == "x" else plot.setYRange)(lo, hi, padding=0)

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
        self._shown = {k: v for k, v in self._shown.items() if k[1] not in ("title", "label")}
        for plot, line in self._markers:
            plot.removeItem(line)
        self._markers.clear()
        self._drawn = [-1] * len(self.GROUPS)
