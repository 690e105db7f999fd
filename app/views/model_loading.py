"""The main window's model loading: the load behind a progress dialog that can cancel it, the engine's start-up
notice, and a crashed engine's banner with a reload. A part the window holds: it is given the widgets it updates
(the controls, the crash banner, the status bar and its labels) and the controller it asks, and the window
connects the controller's load signals to its slots. `changed` says that what the window's actions allow may
have changed (a load ended, the engine died)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import QFileDialog, QLabel, QStatusBar, QWidget

from app.controller import ChatController
from app.dialogs.load_dialog import LoadDialog, describe_target
from app.views.controls_panel import ControlsPanel
from app.views.crash_banner import CrashBanner
from engine.api.protocol import EngineInfo


@dataclass(frozen=True)
class StatusLine:
    """The status bar and the two labels in it that name the engine in use."""

    bar: QStatusBar
    model: QLabel  # the pair, device and context
    notice: QLabel  # the engine's sentence about a slow load, kept while that engine runs


class ModelLoading(QObject):
    changed = Signal()

    def __init__(self, parent: QWidget, controller: ChatController, controls: ControlsPanel, banner: CrashBanner,
                 status: StatusLine, show_error: Callable[[str, str], None]) -> None:
        super().__init__(parent)
        self._parent = parent  # the dialogs' parent
        self.controller, self.controls, self.banner, self.status = controller, controls, banner, status
        self._show_error = show_error
        self.dialog: LoadDialog | None = None  # while a load runs
        self.requested: tuple[str | None, str | None] | None = None  # the pair the running load asked for

    def load_models(self, target: str | None = None, draft: str | None = None, device: str | None = None) -> None:
        """Load in the background behind a progress dialog (None: the embedded pair)."""
        if self.controller.load(target, draft, device, self.controls.context_tokens()):
            self.requested = (target, draft)
            self.controls.show_requested(target, draft)  # in view while it loads; a failure goes back (on_load_failed)
            self._open_dialog(target)

    def reload_models(self) -> None:
        """After a crash: a new engine process with the same models."""
        if self.controller.loading:
            return
        self.banner.hide()
        req = self.controller.reload()
        self.requested = (req.target, req.draft)
        self._open_dialog(req.target)

    def open_model_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self._parent, "Open a model folder")
        if path:
            self.load_models(path, None)

    def open_model_file(self) -> None:
        """A .gguf picked as a file: a folder picker cannot select one, though every other entry takes it."""
        path, _ = QFileDialog.getOpenFileName(self._parent, "Open a GGUF model file", "",
                                              "GGUF models (*.gguf);;All files (*)")
        if path:
            self.load_models(path, None)

    def _open_dialog(self, target: str | None) -> None:
        self.controls.set_loading(True)
        dlg = LoadDialog(target, self._parent)
        dlg.canceled.connect(self._cancel_load)
        dlg.show()
        self.dialog = dlg
        self.status.bar.showMessage(f"Loading {describe_target(target)}\u2026")

    def _cancel_load(self) -> None:
        self.controller.cancel_load()
        self.status.bar.showMessage("Cancelling the load\u2026")

    def _close_dialog(self) -> None:
        self.controls.set_loading(False)
        if self.dialog is not None:
            self.dialog.canceled.disconnect(self._cancel_load)
            self.dialog.close()
            self.dialog.deleteLater()
            self.dialog = None

    # ---- the controller's load signals ---------------------------------------------------------------------
    def on_load_progress(self, stage: str, fraction: float) -> None:
        if self.dialog is not None:
            self.dialog.show_progress(stage, fraction)

    def on_loaded(self, info: EngineInfo) -> None:
        self._close_dialog()
        self.banner.hide()
        self.controls.set_loaded(info.target_name, info.draft_name, info.device, info.dtype_name)
        if self.requested is not None:  # a local load (an attached server's "load" asked for no pair)
            self.controls.show_loaded(*self.requested, info.context)
            self.requested = None
        pair = info.target_name + (f" + {info.draft_name}" if info.draft_name else "")
        context = f" \u00b7 context {info.context:,} tokens" if info.context else ""
        self.status.model.setText(f"{pair} \u00b7 {info.device} \u00b7 {info.dtype_name}{context}")
        self.status.notice.setText(info.notice)
        self.status.notice.setToolTip(info.notice)
        self.status.notice.setVisible(bool(info.notice))
        self.status.bar.clearMessage()
        if not info.notice:  # a passing message would cover the notice for its first seconds
            self.status.bar.showMessage(f"Loaded {pair}", 5000)
        self.changed.emit()

    def on_load_failed(self, message: str) -> None:
        self._close_dialog()
        self.requested = None
        self.controls.show_current()  # the Target box shows what is loaded; the failed path stays listed, to retry
        self.status.bar.clearMessage()
        self._show_error("Could not load the model", message)

    def on_load_cancelled(self) -> None:
        compiling = self.dialog is not None and self.dialog.compiling
        self._close_dialog()
        self.requested = None
        self.controls.show_current()
        said = "Loading cancelled" + ("; the current model stays loaded." if self.controller.ready else ".")
        if compiling:  # the compile runs on in the engine process (engine/cpu/build.py): say so, and why
            said += (" The CPU kernels' compile goes on in the background, so the next load need not start it "
                     "again; quitting SpecLens stops it.")
        self.status.bar.showMessage(said, 15000 if compiling else 5000)

    def on_engine_died(self, sentence: str) -> None:
        """The window stays: one sentence in the banner and the status bar, and a way to reload."""
        self._close_dialog()
        self.banner.show_message(sentence)
        self.status.model.setText("Engine stopped")
        self.status.bar.showMessage(sentence, 10000)
        self.changed.emit()

    def on_models(self, models: list) -> None:
        self.controls.set_local_models(models)
        if self.controls.loaded_pair is not None:  # the list refilled: the Target box still shows what is loaded
            self.controls.show_current()
        else:
            self.controls.select_pair(*self.controls.saved_pair)
