"""File › Attach to server…: the server's URL, an optional plain server (the same model without a draft, for
Compare and the plain reference) and an optional API key. The URLs are remembered (the plain one per server); the
key never is: it lives in the attached host only, or comes from $SPECLENS_API_KEY when left empty."""
from __future__ import annotations

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QFormLayout, QLabel, QLineEdit, QWidget

from app.attach import KEY_ENV


class AttachDialog(QDialog):
    def __init__(self, settings: QSettings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Attach to server")
        self.settings = settings
        self.url_edit = QLineEdit(str(settings.value("attach/url", "http://127.0.0.1:8080")))
        self.url_edit.setToolTip("A running llama-server (with a draft model) or vLLM (with speculative decoding)")
        self.plain_edit = QLineEdit()
        self.plain_edit.setPlaceholderText("optional: the same model served without a draft")
        self.plain_edit.setToolTip("Compare and the speedup charts run the plain side here: K and speculation on/off "
                                   "are a server's start-up flags")
        self.key_edit = QLineEdit()
        self.key_edit.setEchoMode(QLineEdit.EchoMode.Password)
        self.key_edit.setPlaceholderText(f"optional; empty: ${KEY_ENV} if set")
        self.key_edit.setToolTip("Sent as a Bearer token; never saved to settings, traces, CSV or logs")
        form = QFormLayout(self)
        form.addRow("Server URL", self.url_edit)
        form.addRow("Plain server URL", self.plain_edit)
        form.addRow("API key", self.key_edit)
        note = QLabel("http:// or https:// (TLS certificates are verified)")
        note.setEnabled(False)
        form.addRow(note)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        buttons.button(QDialogButtonBox.StandardButton.Ok).setText("Attach")
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        form.addRow(buttons)
        self.url_edit.textChanged.connect(self._fill_plain)
        self._fill_plain(self.url_edit.text())
        self.setMinimumWidth(460)

    def _fill_plain(self, url: str) -> None:
        self.plain_edit.setText(str(self.settings.value(plain_key(url), "")))

    def values(self) -> tuple[str, str | None, str | None]:
        """(url, plain url or None, key or None)."""
        return (self.url_edit.text().strip(), self.plain_edit.text().strip() or None,
                self.key_edit.text() or None)


def plain_key(url: str) -> str:
    """The settings key of the plain server remembered for `url` (QSettings keys cannot hold '/' freely)."""
    return "attach/plain/" + url.strip().rstrip("/").replace("/", "|")
