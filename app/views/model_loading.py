"""The main window's model loading: the load behind a progress dialog that can cancel it, the engine's start-up
notice, and a crashed engine's banner with a reload. A mixin of `MainWindow`, which holds the widgets it updates
(`controls`, `banner`, the status bar's labels) and the controller whose load signals reach these slots."""
from __future__ import annotations

from PySide6.QtWidgets import QFileDialog

from app.dialogs.load_dialog import LoadDialog, describe_target
from engine.api.protocol import EngineInfo


class ModelLoading:
    load_dialog: LoadDialog | None  # while a load runs

    def load_models(self, target: str | None = None, draft: str | None = None, device: str | None = None) -> None:
        """Load in the background behind a progress dialog (None: the embedded pair)."""
        if self.controller.load(target, draft, device, self.controls.context_tokens()):
            self.controls.show_requested(target, draft)  # a refused path stays in view, to retry or change
            self._open_load_dialog(target)

    def reload_models(self) -> None:
        """After a crash: a new engine process with the same models."""
        if self.controller.loading:
            return
        self.banner.hide()
        req = self.controller.reload()
        self._open_load_dialog(req.target)

    def _open_load_dialog(self, target: str | None) -> None:
        self.controls.set_loading(True)
        dlg = LoadDialog(target, self)
        dlg.canceled.connect(self._cancel_load)
        dlg.show()
        self.load_dialog = dlg
        self.statusBar().showMessage(f"Loading {describe_target(target)}\u2026")

    def _cancel_load(self) -> None:
        self.controller.cancel_load()
        self.statusBar().showMessage("Cancelling the load\u2026")

    def _close_load_dialog(self) -> None:
        self.controls.set_loading(False)
        if self.load_dialog is not None:
            self.load_dialog.canceled.disconnect(self._cancel_load)
            self.load_dialog.close()
            self.load_dialog.deleteLater()
            self.load_dialog = None

    def _on_load_progress(self, stage: str, fraction: float) -> None:
        if self.load_dialog is not None:
            self.load_dialog.show_progress(stage, fraction)

    def _on_loaded(self, info: EngineInfo) -> None:
        self._close_load_dialog()
        self.banner.hide()
        self.controls.set_loaded(info.target_name, info.draft_name, info.device, info.dtype_name)
        pair = info.target_name + (f" + {info.draft_name}" if info.draft_name else "")
        context = f" \u00b7 context {info.context:,} tokens" if info.context else ""
        self.model_label.setText(f"{pair} \u00b7 {info.device} \u00b7 {info.dtype_name}{context}")
        self.notice_label.setText(info.notice)
        self.notice_label.setToolTip(info.notice)
        self.notice_label.setVisible(bool(info.notice))
        self.statusBar().clearMessage()
        if not info.notice:  # a passing message would cover the notice for its first seconds
            self.statusBar().showMessage(f"Loaded {pair}", 5000)
        self._update_actions()

    def _on_load_failed(self, message: str) -> None:
        self._close_load_dialog()
        self.statusBar().clearMessage()
        self.show_error("Could not load the model", message)

    def _on_load_cancelled(self) -> None:
        self._close_load_dialog()
        self.statusBar().showMessage("Loading cancelled" + ("; the current model stays loaded."
                                                            if self.controller.ready else "."), 5000)

    def _on_engine_died(self, sentence: str) -> None:
        """The window stays: one sentence in the banner and the status bar, and a way to reload."""
        self._close_load_dialog()
        self.banner.show_message(sentence)
        self.model_label.setText("Engine stopped")
        self.statusBar().showMessage(sentence, 10000)
        self._update_actions()

    def _on_models(self, models: list) -> None:
        self.controls.set_local_models(models)
        self.controls.select_pair(*self.controls.saved_pair)

    def open_model_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(self, "Open a model folder")
        if path:
            self.load_models(path, None)
