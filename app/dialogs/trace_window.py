"""A saved session trace on screen, with no model and no engine process: the chat as it was painted (colours,
tooltips, rejected drafts), the inspector on any token, and the charts. Also the save / open dialogs the main
window's File menu uses, and `speclens TRACE.json` (open_trace_cli)."""
from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from pathlib import Path

from PySide6.QtCore import QObject, QSettings, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMessageBox,
    QProgressDialog,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app.session.trace import Trace, TraceError, count_replies, read_trace, write_trace
from app.views.charts import ChartsPanel
from app.views.chat_view import ChatView
from app.views.inspector_dock import InspectorDock
from app.views.legend import OriginLegend
from app.views.reply_footer import reply_footer
from app.views.resources import app_icon
from engine.analysis.stats import MessageRecord

FILTER = "SpecLens traces (*.json);;All files (*)"
PAINT_AT_ONCE_ROUNDS = 4000  # a chat up to this long is painted before the window shows (about 0.3 s)
PAINT_SLICE_ROUNDS = 300  # longer ones, this many rounds a frame


def footer_of(record: MessageRecord) -> tuple[str, str]:
    """The reply's meta line and closing text, as the main window wrote them."""
    s = record.summary
    if s is None:
        return "ended without a summary (failed or interrupted)", ""
    return reply_footer(s), s.text_tail


class TraceWindow(QMainWindow):
    def __init__(self, trace: Trace, path: Path | None = None, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.trace, self.path = trace, path
        self.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        self.setWindowIcon(app_icon())
        self.setWindowTitle(f"{path.name if path else 'Trace'} \u2014 SpecLens trace")
        self.resize(1400, 860)
        self.header = QLabel()
        self.header.setWordWrap(True)
        self.header.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.chat_select = QComboBox()
        self.chat_select.setToolTip("Each New chat of the session")
        self.chat = ChatView()
        self.chat.setPlaceholderText("This trace has no chat replies.")
        self.legend = OriginLegend()
        self.charts = ChartsPanel()
        self.charts.setMinimumWidth(360)
        self.inspector = InspectorDock(self)
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.inspector)
        self.chat.tokenClicked.connect(self.inspector.show_token)

        top = QHBoxLayout()
        top.addWidget(self.header, 1)
        top.addWidget(self.chat_select)
        left = QWidget()
        lay = QVBoxLayout(left)
        lay.setContentsMargins(8, 6, 4, 8)
        lay.addLayout(top)
        lay.addWidget(self.legend)
        lay.addWidget(self.chat, 1)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(left)
        split.addWidget(self.charts)
        split.setSizes([700, 520])
        split.setChildrenCollapsible(False)
        self.setCentralWidget(split)
        self._build_menus()

        self._painting: Iterator[int] | None = None
        self._paint_total = 0
        self.paint_timer = QTimer(self)
        self.paint_timer.setInterval(0)  # a slice at a time, with the event loop run between slices
        self.paint_timer.timeout.connect(self._paint_next)
        self.chats = sorted({r.chat for r in trace.chat_replies})
        for n in self.chats:
            self.chat_select.addItem(f"Chat {n}", n)
        self.chat_select.setVisible(len(self.chats) > 1)
        self.chat_select.currentIndexChanged.connect(lambda i: self.show_chat(self.chat_select.itemData(i)))
        self.header.setText(self._header_text())
        if self.chats:
            self.chat_select.setCurrentIndex(len(self.chats) - 1)  # the chat on screen when it was saved
            self.show_chat(self.chats[-1])
        if not self.painting:
            self.statusBar().showMessage("Click any token for its distributions.", 8000)

    def _build_menus(self) -> None:
        m = self.menuBar().addMenu("&File")
        open_action = QAction("&Open trace\u2026", self)
        open_action.setShortcut(QKeySequence("Ctrl+Shift+O"))
        open_action.triggered.connect(lambda: open_trace_dialog(self, QSettings()))
        close_action = QAction("&Close", self)
        close_action.setShortcut(QKeySequence(QKeySequence.StandardKey.Close))
        close_action.triggered.connect(self.close)
        m.addActions([open_action, close_action])
        v = self.menuBar().addMenu("&View")
        self.rejected_action = QAction("Show &rejected drafts", self, checkable=True)
        self.rejected_action.setChecked(True)
        self.rejected_action.toggled.connect(self.chat.set_show_rejected)
        v.addAction(self.rejected_action)
        v.addAction(self.inspector.toggleViewAction())

    def _header_text(self) -> str:
        t = self.trace
        models = t.models
        pair = (f"{models.target_name}" + (f" + {models.draft_name}" if models.draft_name else "")
                + f" \u00b7 {models.device} \u00b7 {models.dtype_name}") if models else "models not recorded"
        saved = f"saved {t.saved_at.replace('T', ' ')}" if t.saved_at else "save time not recorded"
        return (f"<b>Trace</b> \u00b7 {pair} \u00b7 {count_replies(t.replies)} \u00b7 {saved}"
                + (f" \u00b7 SpecLens {t.app_version}" if t.app_version else ""))

    def show_chat(self, chat: int) -> None:
        """Paint one chat of the session as the main window did, charts included. A long one is painted over
        several frames (a 20,000-round reply took 1.5 s at once): the window is live, and says how far it is."""
        self.chat.clear_chat()
        self.charts.clear()
        self.inspector.clear()
        records = [r for r in self.trace.replies if r.kind == "chat" and r.chat == chat]
        self._painting = self._paint_steps(records)
        self._paint_total = sum(len(r.rounds) for r in records)
        if self._paint_total <= PAINT_AT_ONCE_ROUNDS:
            for _ in self._painting:
                pass
            self._painting = None
        else:
            self.paint_timer.start()

    def _paint_steps(self, records: list[MessageRecord]) -> Iterator[int]:
        """Paint the records; yields the rounds painted so far after every PAINT_SLICE_ROUNDS of them."""
        done = 0
        for record in records:
            self.chat.add_user(record.prompt)
            self.chat.begin_assistant(record.target or "Assistant")
            self.charts.start_message()
            for i in range(0, len(record.rounds), PAINT_SLICE_ROUNDS):
                for ev in record.rounds[i:i + PAINT_SLICE_ROUNDS]:
                    self.chat.feed(ev)
                    self.charts.feed(ev)
                self.chat.flush()
                done += len(record.rounds[i:i + PAINT_SLICE_ROUNDS])
                yield done
            self.chat.finish(*footer_of(record))
            self.chat.flush()
        self.charts.flush(full=True)

    def _paint_next(self) -> None:
        if self._painting is None:
            self.paint_timer.stop()
            return
        done = next(self._painting, None)
        if done is None:
            self._painting = None
            self.paint_timer.stop()
            self.statusBar().showMessage("Click any token for its distributions.", 8000)
        else:
            self.statusBar().showMessage(f"Painting the chat: {done:,} of {self._paint_total:,} rounds\u2026")

    @property
    def painting(self) -> bool:
        return self._painting is not None


# ---- dialogs ---------------------------------------------------------------------------------------------------
def ask_path(parent: QWidget, settings: QSettings, saving: bool) -> str:
    start = Path(str(settings.value("trace/dir", str(Path.home()))))
    if saving:
        path, _ = QFileDialog.getSaveFileName(parent, "Save trace", str(start / "speclens-trace.json"), FILTER)
    else:
        path, _ = QFileDialog.getOpenFileName(parent, "Open trace", str(start), FILTER)
    if path:
        settings.setValue("trace/dir", str(Path(path).parent))
    return path


def save_trace_dialog(parent: QWidget, trace: Trace, settings: QSettings, path: str | None = None) -> Path | None:
    """Ask where (unless given), write, and say how it went; None when nothing was written."""
    path = path or ask_path(parent, settings, saving=True)
    if not path:
        return None
    try:
        written = write_trace(trace, path)
    except TraceError as e:
        QMessageBox.critical(parent, "Could not save the trace", f"{e}\n\nThe session is kept; try another folder.")
        return None
    return written


def open_trace_dialog(parent: QWidget | None, settings: QSettings, path: str | None = None) -> TraceWindow | None:
    """Ask which file (unless given) and show it in a window of its own: the session on screen stays as it is.
    A file that cannot be read gets a dialog saying why; None then. A large file is read by a thread behind a
    progress dialog (TraceOpener): None at once, and its window opens when the read is done."""
    path = path or ask_path(parent, settings, saving=False)
    if not path:
        return None
    if _size(path) >= BIG_TRACE_BYTES:
        TraceOpener(parent, Path(path)).start()
        return None
    try:
        trace = read_trace(path)
    except TraceError as e:
        QMessageBox.critical(parent, "Could not open the trace", str(e))
        return None
    win = TraceWindow(trace, Path(path), parent)
    win.show()
    return win


# From about this size (a few thousand rounds) a read takes long enough to freeze the window: a thread reads it.
BIG_TRACE_BYTES = 8 << 20


def _size(path: str) -> int:
    try:
        return Path(path).stat().st_size
    except OSError:
        return 0  # read_trace says what is wrong with it


class _Cancelled(Exception):
    pass


_OPENING: set[TraceOpener] = set()


class TraceOpener(QObject):
    """Reads one trace on a thread while a progress dialog (with Cancel) shows how far it is; the window stays
    live. Then opens its TraceWindow, or says why it could not. Keeps itself alive as a child of `parent`."""

    done = Signal(object)  # the TraceWindow, or None (cancelled or failed)

    def __init__(self, parent: QWidget | None, path: Path) -> None:
        super().__init__(parent)
        self.parent_widget, self.path = parent, path
        self.fraction, self.cancelled = 0.0, False
        self.outcome: Trace | TraceError | None = None
        self.finished = False
        self.dialog = QProgressDialog(f"Reading {path.name}\u2026", "Cancel", 0, 1000, parent)
        self.dialog.setWindowTitle("Opening trace")
        self.dialog.setMinimumDuration(0)
        self.dialog.canceled.connect(self._cancel)
        self.timer = QTimer(self)
        self.timer.setInterval(50)
        self.timer.timeout.connect(self._poll)
        self.thread = threading.Thread(target=self._read, name="speclens-trace-reader", daemon=True)

    def start(self) -> None:
        _OPENING.add(self)  # alive until done, even with no parent to hold it
        self.dialog.show()
        self.timer.start()
        self.thread.start()

    def _read(self) -> None:  # the reader thread: touches no widget
        def progress(fraction: float) -> None:
            if self.cancelled:
                raise _Cancelled
            self.fraction = fraction

        try:
            self.outcome = read_trace(self.path, progress)
        except TraceError as e:
            self.outcome = e
        except _Cancelled:
            self.outcome = None
        except Exception as e:  # noqa: BLE001 - a bug in reading must not leave the dialog up forever
            self.outcome = TraceError(f"{self.path.name} could not be opened: {type(e).__name__}: {e}")
        self.finished = True

    def _cancel(self) -> None:
        self.cancelled = True

    def _poll(self) -> None:
        if self.dialog.wasCanceled():  # Esc or cancel() end it without the canceled signal
            self.cancelled = True
        if not self.finished:
            parsed = self.fraction >= 1.0  # then the rounds are checked and built: no fraction for that
            self.dialog.setLabelText(f"{'Checking' if parsed else 'Reading'} {self.path.name}\u2026")
            self.dialog.setValue(999 if parsed else int(self.fraction * 999))
            return
        self.timer.stop()
        self.dialog.reset()
        self.dialog.deleteLater()
        win = None
        if isinstance(self.outcome, TraceError):
            QMessageBox.critical(self.parent_widget, "Could not open the trace", str(self.outcome))
        elif isinstance(self.outcome, Trace) and not self.cancelled:
            win = TraceWindow(self.outcome, self.path, self.parent_widget)
            win.show()
        self.done.emit(win)
        _OPENING.discard(self)
        self.deleteLater()


def open_trace_cli(app: QApplication, path: str, smoke_test: bool = False) -> int:
    """`speclens TRACE.json`: the trace alone, no engine process. Exit status 2 for a file that cannot be read."""
    try:
        trace = read_trace(path)
    except TraceError as e:
        print(f"speclens: {e}", file=sys.stderr)
        if not smoke_test:
            QMessageBox.critical(None, "Could not open the trace", str(e))
        return 2
    win = TraceWindow(trace, Path(path))
    win.show()
    result = {"code": 0}
    if smoke_test:
        def check() -> None:
            ok = win.isVisible() and win.chat.isVisible()
            print(f"smoke-test {'ok' if ok else 'FAILED'}: trace {Path(path).name}, "
                  f"{len(trace.chat_replies)} chat {'reply' if len(trace.chat_replies) == 1 else 'replies'}, "
                  f"{len(win.chat.infos)} tokens painted", flush=True)
            result["code"] = 0 if ok else 1
            win.close()
            app.quit()

        QTimer.singleShot(0, check)
    return app.exec() or result["code"]
