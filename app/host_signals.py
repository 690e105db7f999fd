"""The signals a host gives the controller, declared once: the local engine process's (app/host.py) and an attached
server's (app/remote_host.py) are interchangeable behind them."""
from __future__ import annotations

from PySide6.QtCore import QObject, Signal


class HostSignals(QObject):
    loadProgress = Signal(str, float)  # stage, fraction (< 0: unknown)
    loaded = Signal(object)  # EngineInfo
    loadFailed = Signal(str)  # one sentence
    loadCancelled = Signal()
    modelsListed = Signal(list)
    statusReady = Signal(object)  # EngineStatus
    died = Signal(str)  # why, in one sentence
