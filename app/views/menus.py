"""The main window's commands: each action's text, key and tip, and where it sits in the menus and the
toolbar. The window hands over its slots in `Commands`; this only names and arranges them."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from PySide6.QtCore import Qt
from PySide6.QtGui import QAction, QActionGroup, QKeySequence
from PySide6.QtWidgets import QMainWindow, QMenu, QToolBar

from app.dialogs.draft_finder import open_draft_finder
from app.views.theme import THEMES

Slot = Callable[[], object]


@dataclass(frozen=True)
class Commands:
    """What the actions call, and the actions other panels own that the menus show."""

    new_chat: Slot
    open_model_folder: Slot
    export_stats: Slot
    save_trace: Slot
    open_trace: Slot
    quit: Slot
    send: Slot
    stop: Slot
    compare: Slot
    tune_k: Slot
    show_rejected: Callable[[bool], object]
    focus_input: Slot
    about: Slot
    set_theme: Callable[[str], object]
    step_actions: Sequence[QAction]  # Step through, Next phase, Continue: the step panel's
    inspector_action: QAction  # the inspector dock's show/hide toggle
    open_model_file: Slot = lambda: None  # File > Open model file (.gguf)...
    attach: Slot = lambda: None  # File > Attach to server... (app/views/attach_mode.py)
    detach: Slot = lambda: None


class MainMenus:
    """A part the main window holds: it makes the window's actions (`<name>_action`, the theme ones in
    `theme_actions`) and builds its menu bar and toolbar from them. Every action is also added to the window, so its
    key works wherever the focus is."""

    def __init__(self, window: QMainWindow, c: Commands) -> None:
        self._create_actions(window, c)
        bar = window.menuBar()
        self._file_menu(bar.addMenu("&File"))
        bar.addMenu("&Model").addAction(self.find_draft_action)
        self._run_menu(bar.addMenu("&Run"), window, c.step_actions)
        self._view_menu(bar.addMenu("&View"), c.inspector_action)
        bar.addMenu("&Help").addAction(self.about_action)
        window.addToolBar(self._toolbar(c.step_actions[0]))

    def _create_actions(self, window: QMainWindow, c: Commands) -> None:
        def act(text: str, slot, shortcut: str | None = None, tip: str = "", checkable: bool = False) -> QAction:
            a = QAction(text, window)
            if shortcut is not None:
                a.setShortcut(QKeySequence(shortcut))
            a.setStatusTip(tip or text)
            a.setToolTip(tip or text)
            a.setCheckable(checkable)
            (a.toggled if checkable else a.triggered).connect(slot)
            window.addAction(a)
            return a

        self.new_action = act("&New chat", c.new_chat, "Ctrl+N",
                              "Clear the conversation and the engine's cached prefix")
        self.open_action = act("&Open model folder\u2026", c.open_model_folder, "Ctrl+O",
                               "Load a model folder (config.json + safetensors) as the target")
        self.open_file_action = act("Open model &file (.gguf)\u2026", c.open_model_file, "Ctrl+Shift+G",
                                    "Load a .gguf file as the target (LM Studio, Ollama and llama.cpp keep theirs so)")
        self.export_action = act("&Export session stats\u2026", c.export_stats, "Ctrl+E",
                                 "Write every round of this session to CSV (plus <name>_summary.csv)")
        self.save_trace_action = act("&Save trace\u2026", c.save_trace, "Ctrl+S", "Write the whole session (every "
                                     "round, p/q, verdicts, settings) to a JSON trace")
        self.open_trace_action = act("Open &trace\u2026", c.open_trace, "Ctrl+Shift+O",
                                     "Show a saved trace in its own window (no model needed)")
        self.attach_action = act("&Attach to server\u2026", c.attach, None, "Show the speculation of a running "
                                 "llama-server or vLLM (its URL, optionally a plain server and an API key)")
        self.detach_action = act("&Detach from server", c.detach, None, "Back to the local engine; the chat stays")
        self.quit_action = act("&Quit", c.quit, "Ctrl+Q")
        self.send_action = act("&Send", c.send, "Ctrl+Return", "Send the message")
        self.stop_action = act("S&top", c.stop, "Esc", "Stop after the current round")
        self.compare_action = act("&Compare off vs on\u2026", c.compare, "Ctrl+R",
                                  "Replay the last prompt with speculation off, then on, with the same seed")
        self.tune_action = act("Tune &K\u2026", c.tune_k, "Ctrl+K",
                               "Replay the last prompt plain, then at K = 1..8 with each drafter; apply the best K")
        self.rejected_action = act("Show &rejected drafts", c.show_rejected, "Ctrl+Shift+R",
                                   "Show the drafts the target turned down, struck through", checkable=True)
        self.rejected_action.setChecked(True)
        self.focus_action = act("Focus message box", c.focus_input, "Ctrl+L")
        self.about_action = act("&About SpecLens", c.about)
        self.find_draft_action = act("Find a &draft\u2026", lambda: open_draft_finder(window), None,
                                     "Measure which local model drafts fastest for the loaded target; load the best")
        self._theme_actions(window, c.set_theme)

    def _theme_actions(self, window: QMainWindow, set_theme: Callable[[str], object]) -> None:
        self.theme_group = QActionGroup(window)
        self.theme_actions: dict[str, QAction] = {}
        for key, label in zip(THEMES, ("Follow &system", "&Light", "&Dark")):
            a = QAction(label, window, checkable=True)
            a.triggered.connect(lambda _=False, k=key: set_theme(k))
            self.theme_group.addAction(a)
            self.theme_actions[key] = a

    def _file_menu(self, m: QMenu) -> None:
        m.addActions([self.new_action, self.open_action, self.open_file_action])
        m.addActions([self.attach_action, self.detach_action])
        m.addSeparator()
        m.addAction(self.export_action)
        m.addActions([self.save_trace_action, self.open_trace_action])
        m.addSeparator()
        m.addAction(self.quit_action)

    def _run_menu(self, m: QMenu, window: QMainWindow, step_actions: Sequence[QAction]) -> None:
        m.addActions([self.send_action, self.stop_action])
        m.addSeparator()
        m.addActions([self.compare_action, self.tune_action])
        m.addSeparator()
        m.addActions(list(step_actions))
        window.addActions(list(step_actions))  # their keys work wherever the focus is in the window

    def _view_menu(self, m: QMenu, inspector_action: QAction) -> None:
        m.addAction(self.rejected_action)
        m.addAction(inspector_action)
        themes = m.addMenu("&Theme")
        themes.addActions(list(self.theme_actions.values()))
        m.addSeparator()
        m.addAction(self.focus_action)

    def _toolbar(self, step_through: QAction) -> QToolBar:
        tb = QToolBar("Main")
        tb.setObjectName("main-toolbar")
        tb.setMovable(False)
        tb.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextOnly)
        tb.addActions([self.new_action, self.stop_action, self.compare_action, self.tune_action, self.export_action])
        tb.addAction(step_through)
        tb.addSeparator()
        tb.addAction(self.rejected_action)
        return tb
