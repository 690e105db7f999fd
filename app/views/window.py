"""The main window: chat on the left, live charts and controls on the right. A view over `ChatController`.

The controller's signals arrive in the GUI thread; the slots only append to buffers (chat view, charts). A
20 Hz QTimer repaints from those buffers (the chat at up to 20 Hz, 10 Hz while rounds stream in continuously;
one chart per frame, as the charts' GUI-time budget allows: see app/views/charts.py), so the engine's rate never
sets the paint rate. If the engine process dies, a banner says why in one sentence and offers to reload the
models; the chat, the charts and the session stats stay. The window is composed of parts it holds and wires in
__init__: the menus and toolbar (app/views/menus.py), loading and the crash banner (app/views/model_loading.py),
the stats and trace files (app/views/session_files.py) and attach mode (app/views/attach_mode.py).
"""
from __future__ import annotations

import sys
import time

from PySide6.QtCore import QByteArray, QSettings, QSize, Qt, QTimer
from PySide6.QtGui import QCloseEvent, QGuiApplication
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QMessageBox,
    QPushButton,
    QScrollArea,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from app import __version__
from app.controller import ChatController
from app.dialogs.compare import CompareDialog
from app.dialogs.load_dialog import LoadDialog
from app.dialogs.trace_window import TraceWindow
from app.dialogs.tuner_dialog import TunerDialog
from app.session.names import drafter_name
from app.views.attach_mode import AttachMode
from app.views.charts import ChartsPanel
from app.views.chat_view import ChatView
from app.views.controls_panel import ControlsPanel
from app.views.crash_banner import CrashBanner
from app.views.inspector_dock import InspectorDock
from app.views.legend import OriginLegend
from app.views.menus import Commands, MainMenus
from app.views.model_loading import ModelLoading, StatusLine
from app.views.prompt_edit import PromptEdit
from app.views.reply_footer import reading, reply_footer
from app.views.resources import app_icon
from app.views.session_files import SessionFiles
from app.views.stepper import StepPanel
from app.views.theme import THEMES, apply_theme
from engine.api.events import PrefillProgress, RoundEvent, Summary

FRAME_MS = 50  # repaint timer, 20 Hz: one chart per frame within the charts' time budget ...
TEXT_FRAME_S = 0.09  # ... and the chat at most every other frame (about 10 Hz) while rounds keep coming ...
TEXT_ROUNDS_PER_FRAME = 24  # ... and at most this many rounds of text per frame: one frame's layout stays short
# The least widths of the side panel and the charts: with the chat, the inspector (app/views/inspector_dock.py) and
# step-through open, the window's least width stays under a 1280-px screen's
CONTROLS_MIN_WIDTH, CHARTS_MIN_WIDTH = 260, 320
FIRST_SIZE = (1480, 900)  # the first launch's window, cut to the screen


class MainWindow(QMainWindow):
    def __init__(self, controller: ChatController, settings: QSettings | None = None, *,
                 unattended: bool = False) -> None:
        """unattended: errors go to stderr instead of a dialog (a scripted check of the app, e.g. --load-test)."""
        super().__init__()
        self.controller = controller
        self.unattended = unattended
        self.settings = settings if settings is not None else QSettings()
        self.last_round: RoundEvent | None = None
        self.summary: Summary | None = None  # of the last chat reply, once it arrives
        self.prefill: PrefillProgress | None = None  # how far the running reply's prompt has been read
        self.stopping = False  # Stop was pressed and the reply has not ended yet
        self.compare_dialog: CompareDialog | None = None
        self.tuner_dialog: TunerDialog | None = None
        self.theme = "system"
        self._status_dirty = False
        self._drafted = self._accepted = 0  # this reply's running totals, for the status line
        self._last_text_frame = 0.0
        self.frame_timer = QTimer(self)
        self.frame_timer.setInterval(FRAME_MS)
        self.frame_timer.timeout.connect(self.repaint_frame)

        self.setWindowTitle("SpecLens")
        self.setWindowIcon(app_icon())
        self._build_ui()
        self.resize(self._first_size())
        # The parts, each given what it uses
        self.model_loading = ModelLoading(self, controller, self.controls, self.banner,
                                          StatusLine(self.statusBar(), self.model_label, self.notice_label),
                                          self.show_error)
        self.files = SessionFiles(self, controller, self.controls, self.settings, self.statusBar(), self.show_error)
        self.attach_mode = AttachMode(self)  # File > Attach to server...
        self.menus = MainMenus(self, self._commands())
        m = self.menus  # the actions the window (and attach mode) enable, check or name
        self.new_action, self.send_action, self.stop_action, self.quit_action = (
            m.new_action, m.send_action, m.stop_action, m.quit_action)
        self.compare_action, self.tune_action, self.export_action = m.compare_action, m.tune_action, m.export_action
        self.rejected_action, self.detach_action, self.theme_actions = (
            m.rejected_action, m.detach_action, m.theme_actions)
        self._connect()
        self.attach_mode.connect_signals()
        self._restore()
        self._update_actions()
        self.attach_mode.refresh()

    # ---- layout --------------------------------------------------------------------------------------------
    def _build_ui(self) -> None:
        self.banner = CrashBanner()
        self.chat = ChatView()
        self.legend = OriginLegend()
        self.input = PromptEdit()
        self.send_button = QPushButton("Send")
        self.send_button.setDefault(True)
        self.send_button.setToolTip("Send (Enter)")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("Stop after the current round (Esc)")
        buttons = QVBoxLayout()
        buttons.addWidget(self.send_button)
        buttons.addWidget(self.stop_button)
        buttons.addStretch(1)
        row = QHBoxLayout()
        row.addWidget(self.input, 1)
        row.addLayout(buttons)
        left = QWidget()
        lay = QVBoxLayout(left)
        lay.setContentsMargins(8, 6, 4, 8)
        lay.addWidget(self.banner)
        lay.addWidget(self.legend)
        lay.addWidget(self.chat, 1)
        self.stepper = StepPanel(self.controller, self.chat)  # Run > Step through
        lay.addWidget(self.stepper)
        lay.addLayout(row)

        self.charts = ChartsPanel()
        self.charts.setMinimumWidth(CHARTS_MIN_WIDTH)
        self.controls = ControlsPanel()
        scroll = QScrollArea()
        scroll.setWidget(self.controls)
        scroll.setWidgetResizable(True)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        # Never narrower than its content (fonts differ between desktops): a narrower one clipped its right edge
        scroll.setMinimumWidth(max(CONTROLS_MIN_WIDTH, self.controls.minimumSizeHint().width()
                                   + scroll.verticalScrollBar().sizeHint().width()))
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)

        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.addWidget(left)
        self.splitter.addWidget(self.charts)
        self.splitter.addWidget(scroll)
        self.splitter.setStretchFactor(0, 5)
        self.splitter.setStretchFactor(1, 5)
        self.splitter.setStretchFactor(2, 0)
        self.splitter.setChildrenCollapsible(False)
        self.splitter.setSizes([620, 560, 300])
        self.setCentralWidget(self.splitter)
        self.inspector = InspectorDock(self)  # opens on a click on a token
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.inspector)
        # Opening a panel may raise the window's least size: it then grows, but never past the screen
        self.inspector.visibilityChanged.connect(lambda _on: QTimer.singleShot(0, self.fit_to_screen))
        self.stepper.toggle_action.toggled.connect(lambda _on: QTimer.singleShot(0, self.fit_to_screen))

        bar = self.statusBar()
        self.round_label = QLabel("Idle")
        self.reuse_label = QLabel("")
        self.model_label = QLabel("No model loaded")
        for w in (self.round_label, self.reuse_label, self.model_label):
            w.setContentsMargins(8, 0, 8, 0)
            bar.addPermanentWidget(w)
        # The engine's sentence about a slow load (no compiled kernels): it stays while that engine runs; a
        # passing message covers it only while it shows
        self.notice_label = QLabel("")
        self.notice_label.setObjectName("kernelsNotice")
        self.notice_label.setContentsMargins(8, 0, 8, 0)
        self.notice_label.setStyleSheet("color: #d55e00;")
        self.notice_label.hide()
        bar.addWidget(self.notice_label, 1)

    def _commands(self) -> Commands:
        # The lambdas drop the `checked` argument of triggered(), which these slots would take for a path
        return Commands(
            new_chat=self.new_chat, open_model_folder=self.model_loading.open_model_folder,
            open_model_file=self.model_loading.open_model_file,
            export_stats=lambda: self.files.export_stats(), save_trace=lambda: self.files.save_trace(),
            open_trace=lambda: self.files.open_trace(), quit=self.close, send=self.send, stop=self.stop,
            compare=self.compare, tune_k=self.tune_k, show_rejected=self.chat.set_show_rejected,
            focus_input=lambda: self.input.setFocus(), about=self.about, set_theme=self.set_theme,
            step_actions=(self.stepper.toggle_action, self.stepper.next_action, self.stepper.continue_action),
            inspector_action=self.inspector.toggleViewAction(),
            attach=self.attach_mode.open_dialog, detach=self.attach_mode.detach,
        )

    def _connect(self) -> None:
        self.input.submitted.connect(self.send)
        self.send_button.clicked.connect(self.send)
        self.stop_button.clicked.connect(self.stop)
        self.chat.tokenClicked.connect(self.inspector.show_token)
        self.banner.reload_button.clicked.connect(self.reload_models)
        self.model_loading.changed.connect(self._update_actions)
        self.controls.changed.connect(self.push_controls)
        self.controls.loadRequested.connect(lambda t, d: self.load_models(t, d))
        self.controls.rescanRequested.connect(self.controller.scan_models)
        c = self.controller
        c.replyStarted.connect(self._on_reply_started)
        c.prefillArrived.connect(self._on_prefill)
        c.roundsArrived.connect(self._on_rounds)
        c.replyDone.connect(self._on_summary)
        c.replyFailed.connect(self._on_error)
        c.replyInterrupted.connect(self._on_interrupted)
        c.replyFinished.connect(self._on_finished)
        c.chatCleared.connect(self._on_cleared)
        c.stateChanged.connect(self._update_actions)
        c.stateChanged.connect(self._update_status)  # a pause or a step changes it with no round arriving
        loading = self.model_loading
        c.loadProgress.connect(loading.on_load_progress)
        c.loaded.connect(loading.on_loaded)
        c.loadFailed.connect(loading.on_load_failed)
        c.loadCancelled.connect(loading.on_load_cancelled)
        c.modelsListed.connect(loading.on_models)
        c.engineDied.connect(loading.on_engine_died)
        QGuiApplication.styleHints().colorSchemeChanged.connect(self._on_color_scheme)
        if c.info is not None:
            loading.on_loaded(c.info)

    # ---- the parts' commands, which others (attach mode, the entry point, scripts) ask the window for ----------
    def load_models(self, target: str | None = None, draft: str | None = None, device: str | None = None) -> None:
        self.model_loading.load_models(target, draft, device)

    def reload_models(self) -> None:
        self.model_loading.reload_models()

    @property
    def load_dialog(self) -> LoadDialog | None:
        """The load's progress dialog while a load runs, else None."""
        return self.model_loading.dialog

    def export_stats(self, path: str | None = None) -> bool:
        return self.files.export_stats(path)

    def save_trace(self, path: str | None = None) -> bool:
        return self.files.save_trace(path)

    def open_trace(self, path: str | None = None) -> TraceWindow | None:
        return self.files.open_trace(path)

    # ---- chat ----------------------------------------------------------------------------------------------
    def send(self) -> None:
        text = self.input.toPlainText().strip()
        if not text:
            return
        if not self.controller.ready:
            c = self.controller
            why = ("The model is still loading." if c.loading else
                   "The engine stopped; reload the models first." if c.death else
                   "No model is loaded: choose one under Model and press Load.")
            self.statusBar().showMessage(f"{why} Your message is kept.", 4000)
            return
        if self.controller.send(text, self.controls.sampling_params(), self.controls.spec_params(),
                                self.controls.system_prompt()):
            self.input.clear()

    def _on_reply_started(self, text: str, title: str) -> None:
        self.chat.add_user(text)
        self.chat.begin_assistant(title)
        self.charts.start_message()
        self.last_round = self.summary = self.prefill = None
        self.stopping = False
        self._drafted = self._accepted = 0
        self.reuse_label.setText("")  # known when the reply's Summary arrives
        self.frame_timer.start()
        self._status_dirty = True

    def push_controls(self) -> None:
        """Live settings reach the running reply at its next round."""
        self.controller.update_controls(self.controls.sampling_params(), self.controls.spec_params())

    def stop(self) -> None:
        """Said at once, and kept until the engine confirms: the reply stops at its next round, or at the next
        chunk of a prompt it is still reading."""
        if self.controller.stop():
            self.stopping = True
            self._update_status()
            self._update_actions()

    def new_chat(self) -> None:
        self.controller.new_chat()
        self.input.setFocus()

    def _on_cleared(self) -> None:
        self.last_round = self.summary = None
        self.chat.clear_chat()
        self.inspector.clear()
        self.charts.clear()
        self.reuse_label.setText("")
        self.round_label.setText("Idle")

    def _on_rounds(self, events: list[RoundEvent]) -> None:
        for ev in events:
            self.chat.feed(ev)
            self.charts.feed(ev)
            self._drafted += len(ev.drafted)
            self._accepted += ev.accepted
        self.last_round = events[-1]
        self._status_dirty = True

    def _on_prefill(self, progress: PrefillProgress) -> None:
        self.prefill = progress
        self._update_status()  # one message a chunk at most: no need to wait for the frame timer

    def _on_summary(self, s: Summary) -> None:
        self.summary = s
        self.chat.finish(reply_footer(s, self.prefill), s.text_tail)
        self.reuse_label.setText(f"reused {s.reused_prefix_tokens} prompt tokens")
        self.reuse_label.setToolTip(f"{s.reused_prefix_tokens} of this turn's {s.prompt_tokens} prompt tokens "
                                    "came from the previous turn's KV cache")

    def _on_error(self, message: str) -> None:
        text = self.chat.withdraw_unanswered()
        if text is not None:  # refused before its first round: unsent, so back to the message box
            draft = self.input.toPlainText()
            self.input.setPlainText(text + (f"\n\n{draft}" if draft.strip() else ""))
            self.show_error("Message not sent", f"{message}\n\nYour message is back in the message box.")
            return
        self.chat.finish(f"failed: {message}")
        self.show_error("Generation failed", message)

    def _on_interrupted(self, sentence: str) -> None:
        self.chat.finish("interrupted: the engine process stopped")

    def _on_finished(self) -> None:
        self.stopping = False
        self._status_dirty = True
        self.repaint_frame()
        self.frame_timer.start()  # on until the last rounds are painted

    def repaint_frame(self) -> None:
        """One frame: paint part of what the buffers gathered. While rounds stream in faster than the frame
        rate, the chat (which scrolls, so repaints whole) and the status line take every other frame; a round
        that follows a pause is painted at the next frame. No frame does everything at once, even at the end of
        a reply: the chat takes a bounded number of rounds, the charts one plot (see app/views/charts.py), and the
        timer runs on until both have caught up."""
        now = time.monotonic()
        final = self.controller.active is None
        if final or now - self._last_text_frame >= TEXT_FRAME_S:
            if self.chat.flush(TEXT_ROUNDS_PER_FRAME):
                self._last_text_frame = now
            if self._status_dirty:
                self._status_dirty = False
                self._update_status()
        # Once the reply is over (or paused by step-through) the budget no longer applies: the engine is idle, and
        # the charts catch up.
        charted = self.charts.flush(budgeted=not final and self.controller.paused is None)
        if final and not charted and not self.chat.pending:
            self.frame_timer.stop()

    def _update_status(self) -> None:
        ev, s, running = self.last_round, self.summary, self.controller.active is not None
        going = "Paused (step-through: F10 next phase)" if self.controller.paused is not None else "Generating"
        if running and self.stopping:
            self.round_label.setText("Stopping\u2026")
            return
        p = self.prefill
        if running and p is not None and p.done < p.total:
            self.round_label.setText(reading(p))
            return
        if ev is None:
            self.round_label.setText(f"{going}\u2026" if running else "Idle")
            return
        acc = f"{self._accepted / self._drafted:.0%}" if self._drafted else "\u2014"
        if not running and s is not None:  # the reply as a whole, not its last round (which may be a plain step)
            self.round_label.setText(f"Done \u00b7 {s.rounds} rounds \u00b7 {s.mean_tokens_per_round:.2f} tokens a "
                                     f"round \u00b7 {s.tokens_per_s:.1f} tok/s \u00b7 acceptance {acc} (this reply)")
            return
        tps = ev.new_tokens / ev.elapsed_s if ev.elapsed_s > 0 else 0.0
        k = f"K {ev.k}" if ev.mode == "speculative" else "plain"
        state = going if running else "Stopped"
        self.round_label.setText(f"{state} \u00b7 round {ev.round} \u00b7 {k} \u00b7 {tps:.1f} tok/s \u00b7 "
                                 f"acceptance {acc} (this reply)")

    def _update_actions(self) -> None:
        c = self.controller
        busy, ready = c.busy, c.ready
        self.send_button.setEnabled(ready and not busy)
        self.send_action.setEnabled(ready and not busy)
        self.stop_button.setEnabled(busy and not self.stopping)
        self.stop_action.setEnabled(busy and not self.stopping)
        self.compare_action.setEnabled(ready and not busy and c.last_request is not None)
        self.tune_action.setEnabled(ready and not busy and c.last_request is not None)
        self.banner.reload_button.setEnabled(not c.loading)

    # ---- compare -------------------------------------------------------------------------------------------
    def compare(self) -> CompareDialog | None:
        replay = self.controller.compare_request()
        if replay is None:
            self.statusBar().showMessage("Send a message first; Compare replays the last prompt.", 4000)
            return None
        if self.compare_dialog is not None:
            self.compare_dialog.deleteLater()
        dlg = CompareDialog(self.controller, *replay, self)
        dlg.completed.connect(self._on_compare_done)
        self.compare_dialog = dlg
        dlg.show()
        dlg.start()
        return dlg

    def _on_compare_done(self, _verdict) -> None:
        # The chat's charts keep their own replies' basis: Compare's replays enter neither side of them
        self.frame_timer.start()

    # ---- K tuner -------------------------------------------------------------------------------------------
    def tune_k(self) -> TunerDialog | None:
        replay = self.controller.compare_request()  # the last prompt, its settings, one fixed seed
        if replay is None:
            self.statusBar().showMessage("Send a message first; Tune K replays the last prompt.", 4000)
            return None
        if self.tuner_dialog is not None:
            self.tuner_dialog.deleteLater()
        info = self.controller.info
        dlg = TunerDialog(self.controller, *replay, info is not None and info.draft_name is not None, self)
        dlg.applyRequested.connect(self.apply_k)
        self.tuner_dialog = dlg
        dlg.show()
        dlg.start()
        return dlg

    def apply_k(self, drafter: str, k: int) -> None:
        """The tuner's best: drafter and K into the controls (and so into the next request)."""
        c = self.controls
        c.spec_toggle.setChecked(True)
        c.adaptive_check.setChecked(False)  # the sweep measured fixed K
        c.stop_check.setChecked(False)
        c.drafter_combo.setCurrentIndex(max(c.drafter_combo.findData(drafter), 0))
        c.k_slider.setValue(k)
        self.statusBar().showMessage(f"K set to {k} ({drafter_name(drafter)})", 5000)

    # ---- look + persistence --------------------------------------------------------------------------------
    def _available(self):
        screen = self.screen() or QGuiApplication.primaryScreen()
        return screen.availableGeometry() if screen is not None else None

    def _first_size(self) -> QSize:
        room = self._available()
        w, h = FIRST_SIZE
        return QSize(min(w, room.width()), min(h, room.height())) if room is not None else QSize(w, h)

    def showEvent(self, event) -> None:  # noqa: N802 - Qt naming
        super().showEvent(event)
        QTimer.singleShot(0, self.fit_to_screen)  # the window manager's frame is known once shown

    def fit_to_screen(self) -> None:
        """Keep the whole window on its screen's available area: a panel that opened (the inspector, step-through)
        may have grown it past the edge, and a saved geometry may come from a larger screen."""
        room = self._available()
        if room is None or self.isMaximized() or self.isFullScreen():
            return
        frame = self.frameGeometry()
        if room.contains(frame):
            return
        extra_w, extra_h = frame.width() - self.width(), frame.height() - self.height()  # the window manager's frame
        w = max(min(self.width(), room.width() - extra_w), self.minimumSizeHint().width())
        h = max(min(self.height(), room.height() - extra_h), self.minimumSizeHint().height())
        self.resize(w, h)
        frame = self.frameGeometry()
        x = min(max(frame.x(), room.x()), room.right() + 1 - frame.width())
        y = min(max(frame.y(), room.y()), room.bottom() + 1 - frame.height())
        self.move(max(x, room.x()), max(y, room.y()))

    def set_theme(self, mode: str) -> None:
        self.theme = mode if mode in THEMES else "system"
        self.theme_actions[self.theme].setChecked(True)
        apply_theme(self.theme)

    def _on_color_scheme(self, *_: object) -> None:
        if self.theme == "system":
            apply_theme("system")

    def show_error(self, title: str, text: str) -> None:
        if self.unattended:  # --load-test: nobody is there to close a dialog
            print(f"{title}: {text}", file=sys.stderr, flush=True)
            return
        QMessageBox.critical(self, title, text)

    def about(self) -> None:
        QMessageBox.about(self, "About SpecLens",
                          f"<h3>SpecLens {__version__}</h3><p>A chat over a lossless speculative-decoding engine: "
                          "a draft proposes K tokens, the target verifies them in one pass. Each token is "
                          "coloured by how it was made.</p><p>Colours: Okabe\u2013Ito, safe for colour-vision "
                          "deficiencies.</p>")

    def _restore(self) -> None:
        s = self.settings
        geometry = s.value("window/geometry")
        if isinstance(geometry, QByteArray) and not geometry.isEmpty():
            self.restoreGeometry(geometry)
            self.fit_to_screen()
        state = s.value("window/splitter")
        if isinstance(state, QByteArray) and not state.isEmpty():
            self.splitter.restoreState(state)
        self.rejected_action.setChecked(str(s.value("view/show_rejected", True)).lower() in ("true", "1"))
        self.controls.load_settings(s)
        self.set_theme(str(s.value("view/theme", "system")))

    def save_settings(self) -> None:
        s = self.settings
        s.setValue("window/geometry", self.saveGeometry())
        s.setValue("window/splitter", self.splitter.saveState())
        s.setValue("view/show_rejected", self.rejected_action.isChecked())
        s.setValue("view/theme", self.theme)
        self.controls.save_settings(s)
        s.sync()

    def closeEvent(self, event: QCloseEvent) -> None:
        self.save_settings()
        self.controller.stop()
        if self.compare_dialog is not None:
            self.compare_dialog.close()
        if self.tuner_dialog is not None:
            self.tuner_dialog.close()
        super().closeEvent(event)
