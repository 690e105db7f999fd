"""The main window's commands: each action's text, key and tip, and where it sits in the menus and the
toolbar. The window owns the slots; this only names and arranges them."""
from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import QToolBar

from app.views.theme import THEMES

if TYPE_CHECKING:
    from app.views.window import MainWindow


def build_menus(w: MainWindow) -> None:
    """Create the window's actions (as `w.<name>_action`, the theme ones in `w.theme_actions`), its menu bar and
    its toolbar. Every action is also added to the window, so its key works wherever the focus is."""

    def act(text: str, slot, shortcut=None, tip: str = "", checkable: bool = False) -> QAction:
        a = QAction(text, w)
        if shortcut is not None:
            a.setShortcut(QKeySequence(shortcut))
        a.setStatusTip(tip or text)
        a.setToolTip(tip or text)
        a.setCheckable(checkable)
        (a.toggled if checkable else a.triggered).connect(slot)
        w.addAction(a)
        return a

    w.new_action = act("&New chat", w.new_chat, "Ctrl+N",
                       "Clear the conversation and the engine's cached prefix")
    w.open_action = act("&Open model folder\u2026", w.open_model_folder, "Ctrl+O",
                        "Load a model folder (config.json + safetensors) or a .gguf as the target")
    w.export_action = act("&Export session stats\u2026", lambda: w.export_stats(), "Ctrl+E",
                          "Write every round of this session to CSV (plus <name>_summary.csv)")
    w.save_trace_action = act("&Save trace\u2026", lambda: w.save_trace(), "Ctrl+S",
                              "Write the whole session (every round, p/q, verdicts, settings) to a JSON trace")
    w.open_trace_action = act("Open &trace\u2026", lambda: w.open_trace(), "Ctrl+Shift+O",
                              "Show a saved trace in its own window (no model needed)")
    w.quit_action = act("&Quit", w.close, "Ctrl+Q")
    w.send_action = act("&Send", w.send, "Ctrl+Return", "Send the message")
    w.stop_action = act("S&top", w.stop, "Esc", "Stop after the current round")
    w.compare_action = act("&Compare off vs on\u2026", w.compare, "Ctrl+R",
                           "Replay the last prompt with speculation off, then on, with the same seed")
    w.rejected_action = act("Show &rejected drafts", w.chat.set_show_rejected, "Ctrl+Shift+R",
                            "Show the drafts the target turned down, struck through", checkable=True)
    w.rejected_action.setChecked(True)
    w.focus_action = act("Focus message box", lambda: w.input.setFocus(), "Ctrl+L")
    w.about_action = act("&About SpecLens", w.about)

    menus = w.menuBar()
    m = menus.addMenu("&File")
    m.addActions([w.new_action, w.open_action])
    m.addSeparator()
    m.addAction(w.export_action)
    m.addActions([w.save_trace_action, w.open_trace_action])
    m.addSeparator()
    m.addAction(w.quit_action)
    m = menus.addMenu("&Run")
    m.addActions([w.send_action, w.stop_action])
    m.addSeparator()
    m.addAction(w.compare_action)
    w.tune_action = act("Tune &K\u2026", w.tune_k, "Ctrl+K",
                        "Replay the last prompt plain, then at K = 1..8 with each drafter; apply the best K")
    m.addAction(w.tune_action)
    m.addSeparator()
    step_actions = [w.stepper.toggle_action, w.stepper.next_action, w.stepper.continue_action]
    m.addActions(step_actions)
    w.addActions(step_actions)  # their keys work wherever the focus is in the window
    m = menus.addMenu("&View")
    m.addAction(w.rejected_action)
    m.addAction(w.inspector.toggleViewAction())
    themes = m.addMenu("&Theme")
    w.theme_group = QActionGroup(w)
    w.theme_actions = {}
    for key, label in zip(THEMES, ("Follow &system", "&Light", "&Dark")):
        a = QAction(label, w, checkable=True)
        a.triggered.connect(lambda _=False, k=key: w.set_theme(k))
        w.theme_group.addAction(a)
        themes.addAction(a)
        w.theme_actions[key] = a
    m.addSeparator()
    m.addAction(w.focus_action)
    m = menus.addMenu("&Help")
    m.addAction(w.about_action)

    tb = QToolBar("Main")
    tb.setObjectName("main-toolbar")
    tb.setMovable(False)
    tb.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextOnly)
    tb.addActions([w.new_action, w.stop_action, w.compare_action, w.tune_action, w.export_action])
    tb.addAction(w.stepper.toggle_action)
    tb.addSeparator()
    tb.addAction(w.rejected_action)
    w.addToolBar(tb)
