"""Model › Find a draft: which local model drafts fastest for the loaded target, measured here.

The finder (engine/tools/draft_finder.py) runs in a process of its own (engine/tools/draft_worker.py), never on the
GUI thread and never in the engine process, whose pair stays loaded as it is. A reader thread blocks on the pipe and
hands each message to the GUI thread through a queued signal, as the engine host does, so nothing touches a widget
from another thread. The dialog shows the progress with Cancel, then one row per measured candidate (measured
speedup, Leviathan's prediction, best K, alpha, c) and one per model turned down with its reason; "Load this pair"
loads the target with the chosen draft (the n-gram drafter: the target alone) and sets its best K.
"""
from __future__ import annotations

import logging
import threading
from typing import Any

from PySide6.QtCore import QObject, Qt, QTimer, Signal
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QHeaderView,
    QLabel,
    QProgressBar,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from app.thread_post import ThreadPost
from engine.io.model_dirs import SOURCE_NAMES
from engine.service.loaders import Factory
from engine.tools.draft_finder import near_tie_advice
from engine.tools.draft_worker import CANCEL, FINDER, spawn

log = logging.getLogger(__name__)

COLUMNS = ("Draft", "Speedup", "Leviathan", "Best K", "\u03b1", "c", "Tokens/round", "Family", "Source")
REJECTED_COLUMNS = ("Model", "Why not", "Family", "Source")
MAX_NEW_TOKENS = 48
TIME_BUDGET_S = 300.0
NOISE = 1.05  # as the K tuner's: a best speedup under this is no clear win over plain decoding
FINDER_FOR_WINDOW: Factory = FINDER  # what the menu's dialog runs (tests name a scripted finder here)


class FinderWorker(QObject):
    """The finder's process seen from the GUI thread. Signals (GUI thread): progressed(str stage, float fraction),
    finished(dict result JSON), failed(str sentence); exactly one of the last two, once."""

    progressed = Signal(str, float)
    finished = Signal(object)
    failed = Signal(str)
    _message = Signal(object)  # reader thread -> GUI thread

    def __init__(self, finder: Factory, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.finder = finder
        self.process: Any = None
        self._conn: Any = None
        self.done = False
        self._message.connect(self._dispatch, Qt.ConnectionType.QueuedConnection)
        self._emit = self._message.emit  # bound here, on the GUI thread: the reader reaches it only through _mail
        self._mail = ThreadPost()  # shut by stop() (the dialog is going) or as this worker is deleted
        self.destroyed.connect(self._mail.close)

    def start(self) -> None:
        self.process, self._conn = spawn(self.finder)
        threading.Thread(target=self._read, args=(self._conn,), name="speclens-draft-finder-reader",
                         daemon=True).start()

    def cancel(self) -> None:
        """Ask the finder to stop: it ends within a round of the replay it is in, and still reports what it has."""
        if self._conn is None or self.done:
            return
        try:
            self._conn.send(CANCEL)
        except (OSError, ValueError):  # already gone: the reader reports how
            pass

    def stop(self, grace_ms: int = 3000) -> None:
        """Cancel, and kill the process if it has not ended grace_ms later: the dialog is going away. Nothing
        waits here (the GUI never freezes); the timer holds the process, not this worker, which may be gone."""
        self.cancel()
        self._mail.close()
        proc = self.process
        if proc is not None and proc.exitcode is None:
            QTimer.singleShot(grace_ms, lambda: proc.kill() if proc.exitcode is None else None)

    def _read(self, conn: Any) -> None:
        """Reader thread: touches no Qt object but the signal, through `_mail`."""
        while True:
            try:
                msg = conn.recv()
            except (EOFError, OSError):
                break
            except Exception as e:  # noqa: BLE001 - bytes that do not unpickle: the next may
                log.warning("unreadable message from the draft finder: %r", e)
                continue
            if not self._mail.post(self._emit, msg):
                return  # stopped: nobody is left to tell
        self._mail.post(self._emit, ("lost",))

    def _dispatch(self, msg: object) -> None:
        if self.done or not isinstance(msg, tuple) or not msg:
            return
        kind = msg[0]
        if kind == "progress" and len(msg) == 3:
            self.progressed.emit(str(msg[1]), float(msg[2]))
        elif kind == "done" and len(msg) == 2 and isinstance(msg[1], dict):
            self.done = True
            self.finished.emit(msg[1])
        elif kind == "failed" and len(msg) == 2:
            self.done = True
            self.failed.emit(str(msg[1]))
        elif kind == "lost":
            self.done = True
            code = self.process.exitcode if self.process is not None else None
            self.failed.emit("the draft finder's process ended before it reported"
                             + (f" (exit status {code})" if code else ""))


def _cell(text: str, tip: str = "", align_right: bool = False) -> QTableWidgetItem:
    item = QTableWidgetItem(text)
    item.setFlags(Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable)
    if tip:
        item.setToolTip(tip)
    if align_right:
        item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
    return item


def _name(r: dict) -> str:
    """A candidate's name as the picker gives it: an LM Studio or llama.cpp file by its file name (the cell's tooltip
    has the whole path), so the reasons beside it stay in view."""
    name = r.get("name") or ""
    return name.rsplit("/", 1)[-1] if r.get("source") in ("lm-studio", "llama.cpp") else name


def _source(r: dict) -> str:
    return SOURCE_NAMES.get(r.get("source") or "", r.get("source") or "")


def _x(v: float | None) -> str:
    return "\u2014" if v is None else f"{v:.2f}\u00d7"


def _f(v: float | None, digits: int = 2) -> str:
    return "\u2014" if v is None else f"{v:.{digits}f}"


class DraftFinderDialog(QDialog):
    """loadRequested(target path, draft path or None): load this pair; applyRequested(drafter, K): set the
    controls to the chosen draft's drafter and best K."""

    loadRequested = Signal(str, object)
    applyRequested = Signal(str, int)

    def __init__(self, target: str | None, target_name: str, prompts: list[list[dict[str, str]]] | None = None,
                 parent: QWidget | None = None, *, finder: Factory | None = None,
                 max_new_tokens: int | None = None, time_budget_s: float | None = None) -> None:
        super().__init__(parent)
        # Read here, not at import: a script or test that sets the module's values shortens the menu's run too
        max_new_tokens = MAX_NEW_TOKENS if max_new_tokens is None else max_new_tokens
        time_budget_s = TIME_BUDGET_S if time_budget_s is None else time_budget_s
        self.setWindowTitle("Find a draft")
        self.resize(1000, 600)
        self.result: dict | None = None
        self.error: str | None = None
        self.cancelled = False
        self.advice = ""  # the bench command that tells a near tie apart, when the first two are one
        kwargs = {"target": target, "prompts": prompts, "max_new_tokens": max_new_tokens,
                  "time_budget_s": time_budget_s}
        base = finder or FINDER
        self.worker = FinderWorker(Factory(base.path, {**base.kwargs, **kwargs}, base.warm), self)
        self.worker.progressed.connect(self._on_progress)
        self.worker.finished.connect(self._on_finished)
        self.worker.failed.connect(self._on_failed)

        which = "your last prompt" if prompts else "a short built-in mix of prompts"
        intro = QLabel(f"Every local model that can draft for <b>{target_name}</b> (it runs here, is smaller, and "
                       f"speaks the same tokens), and the n-gram drafter, each measured on {which}: greedy, "
                       f"{max_new_tokens} new tokens a prompt, plain decoding and then each K, at most "
                       f"{time_budget_s:g} s in all. Speedup is the best K's decode rate over plain decoding's in "
                       "the same load; Leviathan's is what the measured \u03b1 and c predict. The finder loads "
                       "each pair in a process of its own; the models you chat with stay loaded.")
        intro.setWordWrap(True)
        intro.setObjectName("intro")
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.verticalHeader().setVisible(False)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.table.horizontalHeader().setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        self.table.itemSelectionChanged.connect(self._update_load_button)
        self.table.itemDoubleClicked.connect(lambda _item: self.load_selected())
        self.rejected_label = QLabel("Not a draft for this target:")
        self.rejected = QTableWidget(0, len(REJECTED_COLUMNS))
        self.rejected.setHorizontalHeaderLabels(REJECTED_COLUMNS)
        self.rejected.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.rejected.verticalHeader().setVisible(False)
        self.rejected.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.rejected.horizontalHeader().setSectionResizeMode(1, QHeaderView.ResizeMode.Stretch)
        # A reason is a sentence: it wraps in its column, each row as tall as its reason, rather than running off
        # to the right behind a scroll bar
        self.rejected.setWordWrap(True)
        self.rejected.verticalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.rejected.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.status = QLabel("Starting\u2026")
        self.status.setWordWrap(True)
        buttons = QDialogButtonBox()
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("Stop measuring after the current round; what was measured stays")
        self.cancel_button.clicked.connect(self.cancel)
        self.load_button = QPushButton("Load this pair")
        self.load_button.setEnabled(False)
        self.load_button.clicked.connect(self.load_selected)
        self.copy_button = QPushButton("Copy the bench command")
        self.copy_button.setToolTip("The speclens-bench run that tells the first two apart, for a terminal")
        self.copy_button.clicked.connect(self.copy_advice)
        buttons.addButton(self.copy_button, QDialogButtonBox.ButtonRole.ActionRole)
        self.copy_button.setVisible(False)  # after addButton, which shows it; only a near tie needs it
        buttons.addButton(self.cancel_button, QDialogButtonBox.ButtonRole.ActionRole)
        buttons.addButton(self.load_button, QDialogButtonBox.ButtonRole.ActionRole)
        buttons.addButton(QDialogButtonBox.StandardButton.Close).clicked.connect(self.close)

        lay = QVBoxLayout(self)
        lay.addWidget(intro)
        lay.addWidget(self.table, 2)
        lay.addWidget(self.rejected_label)
        lay.addWidget(self.rejected, 2)
        lay.addWidget(self.status)
        lay.addWidget(self.progress)
        lay.addWidget(buttons)

    # ---- running -------------------------------------------------------------------------------------------
    def start(self) -> None:
        self.worker.start()

    @property
    def running(self) -> bool:
        return self.worker.process is not None and not self.worker.done

    def cancel(self) -> None:
        if not self.running:
            return
        self.cancelled = True
        self.worker.cancel()
        self.cancel_button.setEnabled(False)
        self.status.setText("Cancelling\u2026 the running replay stops at its next round.")

    def _on_progress(self, stage: str, fraction: float) -> None:
        self.progress.setValue(int(1000 * max(0.0, min(1.0, fraction))))
        if not self.cancelled:
            self.status.setText(f"{stage}")

    def _on_failed(self, message: str) -> None:
        self.error = message
        self.cancel_button.setEnabled(False)
        self.status.setText(f"Stopped: {message}")

    def _on_finished(self, result: dict) -> None:
        self.result = result
        self.cancel_button.setEnabled(False)
        self.progress.setValue(1000)
        self.fill(result)
        measured = result.get("measured") or []
        if result.get("cancelled"):
            head = f"Cancelled: {len(measured)} measured."
        elif result.get("out_of_time"):
            head = f"The time budget ran out: {len(measured)} measured."
        else:
            head = f"Done in {result.get('elapsed_s', 0):.0f} s: {len(measured)} measured."
        best = measured[0] if measured else None
        if best is not None:
            head += (f" Fastest here: {best['name']} at K={best['best_k']}, {_x(best['speedup'])} plain decoding "
                     f"({best['plain_tokens_per_s']:.1f} tok/s plain).")
            if best["speedup"] < 1.0:
                head += " None beat plain decoding on these prompts: speculation does not pay here."
            elif best["speedup"] < NOISE:
                head += (" That is within a few percent of plain decoding, about how much single replays' rates vary: "
                         "no draft clearly pays here.")
            elif result.get("near_tie"):
                second = measured[1]
                head += (f" {second['name']} ({_x(second['speedup'])}) is within the finder's noise of it: measure "
                         "the two longer before choosing (\u201cCopy the bench command\u201d).")
                self.advice = near_tie_advice(result)
                self.status.setToolTip(self.advice)
                self.copy_button.setVisible(True)
        self.status.setText(head)
        if self.table.rowCount():
            self.table.selectRow(0)

    # ---- the result ----------------------------------------------------------------------------------------
    def fill(self, result: dict) -> None:
        measured = result.get("measured") or []
        self.table.setRowCount(len(measured))
        for row, m in enumerate(measured):
            name = _cell(_name(m), m.get("path") or "drafts from the conversation itself (no model)")
            name.setData(Qt.ItemDataRole.UserRole, m)
            cells = [name, _cell(_x(m.get("speedup")), "measured: the best K's decode rate over plain's", True),
                     _cell(_x(m.get("predicted")), "Leviathan's speedup at that K from the measured \u03b1 and c",
                           True),
                     _cell(str(m.get("best_k")), "", True), _cell(_f(m.get("alpha")), "per-token acceptance", True),
                     _cell(_f(m.get("c"), 3), "a draft step's time over a target step's", True),
                     _cell(_f(m.get("mean_accepted_length")), "tokens committed per round at the best K", True),
                     _cell(m.get("family") or ""), _cell(_source(m))]
            if m.get("note"):
                for c in cells:
                    c.setToolTip(f"{c.toolTip()}\n{m['note']}".strip())
            for col, c in enumerate(cells):
                self.table.setItem(row, col, c)
        rejected = result.get("rejected") or []
        not_measured = [*(result.get("not_measured") or []), *(result.get("copies") or [])]
        turned_down = [*rejected, *not_measured]
        self.rejected.setRowCount(len(turned_down))
        dim = self.palette().color(QPalette.ColorRole.PlaceholderText)
        # A model not measured for want of time is still a draft for this target: the label says both kinds
        self.rejected_label.setText("Not a draft for this target, or not measured:" if rejected and not_measured
                                    else "Not measured:" if not_measured else "Not a draft for this target:")
        for row, r in enumerate(turned_down):
            for col, text in enumerate((_name(r), r["reason"], r.get("family") or "", _source(r))):
                c = _cell(text, r["reason"] if col == 1 else (r.get("path") or ""))
                c.setForeground(QColor(dim))
                self.rejected.setItem(row, col, c)
        self.rejected_label.setVisible(bool(turned_down))
        self.rejected.setVisible(bool(turned_down))

    def copy_advice(self) -> None:
        QGuiApplication.clipboard().setText(self.advice)
        self.status.setText(f"{self.status.text()} Copied.")

    def selected(self) -> dict | None:
        rows = self.table.selectionModel().selectedRows()
        item = self.table.item(rows[0].row(), 0) if rows else None
        return item.data(Qt.ItemDataRole.UserRole) if item is not None else None

    def _update_load_button(self) -> None:
        m = self.selected()
        self.load_button.setEnabled(m is not None and self.result is not None)
        if m is not None:
            what = "the target alone (n-gram, " if m.get("path") is None else "this pair ("
            self.load_button.setText(f"Load {what}K={m['best_k']})")

    def load_selected(self) -> None:
        m = self.selected()
        if m is None or self.result is None:
            return
        target = self.result["target"]["path"]
        self.applyRequested.emit("ngram" if m.get("path") is None else "model", int(m["best_k"]))
        self.loadRequested.emit(target, m.get("path"))
        self.status.setText(f"Loading {self.result['target']['name']} with {m['name']}, K={m['best_k']}\u2026")

    def closeEvent(self, event) -> None:  # Qt names it
        if self.running:
            self.worker.stop()
        super().closeEvent(event)


def open_draft_finder(window) -> DraftFinderDialog | None:
    """Model › Find a draft from the main window: the loaded target (the embedded one when none was named), the
    last prompt when there is one; the chosen pair goes to the window's load and its K to the controls."""
    c = window.controller
    if getattr(c, "remote", None) is not None:
        window.statusBar().showMessage("Find a draft measures local models: detach from the server first.", 5000)
        return None
    if c.info is None or c.loading:
        window.statusBar().showMessage("Load a target first; Find a draft ranks drafts for it.", 5000)
        return None
    last = getattr(c.host, "last_load", None)
    replay = c.compare_request()
    old = getattr(window, "draft_finder_dialog", None)
    if old is not None:
        old.close()
        old.deleteLater()
    dlg = DraftFinderDialog(last.target if last is not None else None, c.info.target_name,
                            [replay[0]] if replay is not None else None, window, finder=FINDER_FOR_WINDOW)
    dlg.applyRequested.connect(window.apply_k)
    dlg.loadRequested.connect(lambda target, draft: window.load_models(target, draft))
    window.draft_finder_dialog = dlg
    dlg.show()
    dlg.start()
    return dlg
