"""The main window's session files: the stats as CSV and the session trace, saved and opened. A part the window
holds, given what it reads (the controller's session, the controls' settings) and where it reports; nothing here
touches the session itself, so a failed write loses nothing."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QFileDialog, QStatusBar, QWidget

from app import __version__
from app.controller import ChatController
from app.dialogs.trace_window import TraceWindow, open_trace_dialog, save_trace_dialog
from app.session.trace import Settings, count_replies, session_trace
from app.views.controls_panel import ControlsPanel
from engine.analysis.stats import tuner_path


class SessionFiles:
    def __init__(self, parent: QWidget, controller: ChatController, controls: ControlsPanel, settings: QSettings,
                 status: QStatusBar, show_error: Callable[[str, str], None]) -> None:
        self._parent = parent  # the dialogs' parent
        self.controller, self.controls, self.settings, self.status = controller, controls, settings, status
        self._show_error = show_error

    def export_stats(self, path: str | None = None) -> bool:
        if path is None:
            start = str(self.settings.value("export/dir", str(Path.home())))
            # The caption names both files: the rounds go to NAME.csv, the replies to NAME_summary.csv beside it
            path, _ = QFileDialog.getSaveFileName(self._parent, "Export session stats: NAME.csv (one row per round) "
                                                  "and NAME_summary.csv (one per reply) beside it",
                                                  str(Path(start) / "speclens-stats.csv"), "CSV files (*.csv)")
            if not path:
                return False
        stats = self.controller.stats
        try:
            main, side = stats.write_csv(path)
        except OSError as e:
            self._show_error("Could not export the session stats",
                             f"{path} could not be written:\n{e.strerror or e}\n\nThe session is kept; "
                             "try another folder.")
            return False
        self.settings.setValue("export/dir", str(Path(path).parent))
        sweeps = f" and {tuner_path(path).name} (the K tuner)" if stats.sweeps else ""
        self.status.showMessage(f"Wrote {main.name} ({len(stats.round_rows())} rounds) and {side.name}{sweeps}", 6000)
        return True

    def save_trace(self, path: str | None = None) -> bool:
        c, ctl = self.controller, self.controls
        if not c.stats.records:
            self.status.showMessage("Nothing to save yet: send a message first.", 4000)
            return False
        trace = session_trace(c.stats.records, c.conversation, c.info,
                              Settings(ctl.sampling_params(), ctl.spec_params(), ctl.system_prompt()), __version__)
        written = save_trace_dialog(self._parent, trace, self.settings, path)
        if written is not None:
            self.status.showMessage(f"Wrote {written.name} ({count_replies(trace.replies)})", 6000)
        return written is not None

    def open_trace(self, path: str | None = None) -> TraceWindow | None:
        """In a window of its own: this session stays as it is, whatever the file holds."""
        return open_trace_dialog(self._parent, self.settings, path)
