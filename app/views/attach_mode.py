"""The main window in attach mode: File › Attach to server… and Detach, and what an attached server does not
reveal or take, shown disabled with a one-line reason instead of imitated.

Attaching connects on a thread behind the status bar (the controller builds the server's host and connects it:
ChatController.attach); the local engine stays loaded and the chat stays. Once the server answers, the controller
sends replies there and the window names the server's model and kind where the local pair's name was. Detach
returns to the local engine, loading it if it never was (`speclens --attach URL` starts without it). What this
knows of the server is the controller's `attachment` (app.attach.Attached): plain values.
"""
from __future__ import annotations

from PySide6.QtCore import QObject, Signal
from PySide6.QtGui import QAction
from PySide6.QtWidgets import QDialog, QPushButton, QWidget

from app.attach import Attached
from app.dialogs.attach_dialog import AttachDialog, plain_key

# What an attached server cannot show or do, and why (one line each, in the widgets' tooltips)
NO_SPEC_CONTROLS = ("K, the drafter and adaptive K are the server's start-up flags (llama-server: -md, "
                    "--spec-draft-n-max); it does not take them per request")
NO_DRAFTER_CONTROLS = "The server drafts with its own draft model: the drafter, adaptive K and the early stop are its own"
NO_SPEC_TOGGLE = "This server drafts on every request: give a plain server URL (File \u203a Attach) to turn it off"
SPEC_TOGGLE_PER_REQUEST = "Off: this server takes speculation off per request (it was asked and it did)"
SPEC_TOGGLE_PLAIN = "Off: replies come from the plain server (the same model without a draft)"
NO_TUNE = "Tune K needs K per request; this server's K is a start-up flag"
NO_STEP = "A server does not pause between a round's phases"
NO_INSPECTOR = "A server sends no p or q for its tokens: there is nothing to inspect"
NO_REJECTED = "A server never sends its rejected drafts, only how many there were"
NO_DRAFTING = ("The server drafted nothing for this reply: a llama-server started with a draft model (-md) but "
               "without --spec-type draft-simple loads the draft and never drafts")
NO_COMPARE = "Compare needs a plain server URL (File \u203a Attach to server\u2026): the server's speculation is a " \
             "start-up flag"


class AttachMode(QObject):
    attachFailed = Signal(str)

    def __init__(self, window) -> None:
        super().__init__(window)
        self.window = window
        self._tips: dict[QObject, str] = {}  # each widget's own tooltip, restored on detach
        self._cancel: QPushButton | None = None

    @property
    def attached(self) -> Attached | None:
        return self.window.controller.attachment

    def connect_signals(self) -> None:
        """After the window's own connections: refresh() runs after its _update_actions."""
        c = self.window.controller
        c.stateChanged.connect(self.refresh)
        c.loaded.connect(lambda _info: self.refresh())
        c.replyDone.connect(self._check_drafting)
        c.attachProgress.connect(self._connecting)
        c.attachDone.connect(self._connected)
        c.attachFailed.connect(self._failed)
        c.attachCancelled.connect(self._cancelled)

    def _cancel_button(self) -> QPushButton:
        """The status bar's Cancel while a server is being connected to (made on first use)."""
        if self._cancel is None:
            self._cancel = QPushButton("Cancel")
            self._cancel.setToolTip("Stop connecting to the server; what is in use stays in use")
            self._cancel.clicked.connect(self.window.controller.cancel_attach)
            self.window.statusBar().addPermanentWidget(self._cancel)
        return self._cancel

    def _connecting(self, stage: str) -> None:
        self.window.statusBar().showMessage(stage)
        self._cancel_button().show()

    def _done_connecting(self) -> None:
        if self._cancel is not None:
            self._cancel.hide()

    def _cancelled(self) -> None:
        self._done_connecting()
        self.window.statusBar().showMessage("Stopped connecting to the server", 5000)

    def _check_drafting(self, s) -> None:
        """A server with a draft model that drafted nothing: llama-server loads a draft and never uses it unless
        started with --spec-type; say so rather than show a reply of plain steps without a word."""
        server = self.attached
        if server is not None and server.speculative \
                and s.stop_reason != "cancelled" and s.new_tokens > 2 and s.drafted == 0:
            self.window.statusBar().showMessage(NO_DRAFTING, 15000)

    # ---- attach / detach -------------------------------------------------------------------------------------
    def open_dialog(self) -> QDialog:
        dlg = AttachDialog(self.window.settings, self.window)
        dlg.accepted.connect(lambda: self.attach(*dlg.values()))
        dlg.open()
        return dlg

    def attach(self, url: str, plain_url: str | None = None, api_key: str | None = None) -> bool:
        """Connect in the background; the controller switches to the server once it answers."""
        return self.window.controller.attach(url, plain_url, api_key)

    def _connected(self, server: Attached) -> None:
        self._done_connecting()
        s = self.window.settings
        s.setValue("attach/url", server.url)  # never user:password, never the key
        s.setValue(plain_key(server.url), server.plain_url or "")
        notes = "; ".join(server.notes)
        self.window.statusBar().showMessage(f"Attached to {server.label}" + (f" ({notes})" if notes else ""), 8000)

    def _failed(self, message: str) -> None:
        self._done_connecting()
        self.window.statusBar().clearMessage()
        self.attachFailed.emit(message)
        local = "The local engine stays in use." if self.window.controller.local_ready else "Nothing was changed."
        self.window.show_error("Could not attach to the server", f"{message}\n\n{local}")

    def detach(self) -> None:
        c = self.window.controller
        if c.attachment is None:
            return
        c.detach()
        if not c.local_ready and not c.loading:
            self.window.load_models()
        self.window.statusBar().showMessage("Detached: replies come from the local engine again", 5000)

    # ---- what attach mode disables ---------------------------------------------------------------------------
    def refresh(self) -> None:
        w, server = self.window, self.attached
        w.detach_action.setEnabled(server is not None)
        ctl = w.controls
        spec_widgets = (ctl.drafter_combo, ctl.k_slider, ctl.adaptive_check, ctl.stop_check)
        actions = ((w.tune_action, NO_TUNE), (w.stepper.toggle_action, NO_STEP),
                   (w.inspector.toggleViewAction(), NO_INSPECTOR), (w.rejected_action, NO_REJECTED))
        if server is None:
            for obj, tip in self._tips.items():
                obj.setToolTip(tip)
                if isinstance(obj, QAction):
                    obj.setStatusTip(tip)
                if obj not in (w.tune_action, w.compare_action):  # the window's _update_actions decided those
                    obj.setEnabled(True)
            self._tips.clear()
            ctl.update_labels()  # the speculation widgets' own enabled rule
            return
        per_request = server.per_request_spec is True
        for widget in spec_widgets:
            if not per_request:
                self._disable(widget, NO_SPEC_CONTROLS)
            elif widget is not ctl.k_slider:  # K goes into each request where the server honours it
                self._disable(widget, NO_DRAFTER_CONTROLS)
        has_plain = server.has_plain
        if per_request and not has_plain:  # off: the same server with "speculative.n_max": 0
            self._keep_tip(ctl.spec_toggle)
            ctl.spec_toggle.setToolTip(SPEC_TOGGLE_PER_REQUEST)
        elif has_plain:
            self._keep_tip(ctl.spec_toggle)
            ctl.spec_toggle.setToolTip(SPEC_TOGGLE_PLAIN)
        else:
            self._disable(ctl.spec_toggle, NO_SPEC_TOGGLE)
            self._disable(w.compare_action, NO_COMPARE)
        for action, why in actions:
            self._disable(action, why)

    def _keep_tip(self, obj: QObject) -> None:
        self._tips.setdefault(obj, obj.toolTip())

    def _disable(self, obj: QWidget | QObject, why: str) -> None:
        self._keep_tip(obj)
        obj.setEnabled(False)
        obj.setToolTip(why)
        if isinstance(obj, QAction):
            obj.setStatusTip(why)
