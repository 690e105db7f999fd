"""The real window on an X display (Xvfb) for the screenshot scripts: one place for the set-up they share."""
import os
import sys
import tempfile
import time


def open_window(tiny_loader_kw: dict | None = None):
    """(QApplication, ChatController, MainWindow), the window shown at 1480x900 in the theme named by argv[1].
    MODELS=tiny runs tests/tiny.py's pair with tiny_loader_kw instead of the embedded one."""
    os.environ["QT_QPA_PLATFORM"] = "xcb"
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    from app.controller import ChatController
    from app.host import EngineHost
    from app.views.resources import app_icon
    from app.views.window import MainWindow
    from engine.service.loaders import DEFAULT_LISTER, DEFAULT_LOADER, Factory

    qa = QApplication([])
    qa.setStyle("Fusion")
    qa.setApplicationName("SpecLens")
    qa.setWindowIcon(app_icon())
    tiny = os.environ.get("MODELS") == "tiny"
    loader = Factory("tests.app_fixtures:tiny_loader", {"max_seq_len": 512, **(tiny_loader_kw or {})}) if tiny \
        else DEFAULT_LOADER
    controller = ChatController(EngineHost(loader, DEFAULT_LISTER))
    w = MainWindow(controller, QSettings(tempfile.mktemp(suffix=".ini"), QSettings.Format.IniFormat))
    w.set_theme(sys.argv[1] if len(sys.argv) > 1 else "light")
    w.resize(1480, 900)
    w.show()
    return qa, controller, w


def wait(ms: int) -> None:
    """Run the event loop for ms milliseconds."""
    from PySide6.QtCore import QEventLoop, QTimer

    loop = QEventLoop()
    QTimer.singleShot(ms, loop.quit)
    loop.exec()


def wait_until(cond, timeout: float = 900) -> None:
    t = time.time()
    while not cond():
        wait(20)
        if time.time() - t > timeout:
            raise TimeoutError


def load_pair(controller, w, timeout: float = 900, scan: bool = True, on_shown=None) -> bool:
    """Load the pair (embedded, or MODELS=tiny's) as the window's Load does and wait for it; prints what loaded and
    how long it took, and returns whether the engine is ready. scan: list the local models first, as app.main does
    (the model panel then knows the pair's context limit and KV cost). on_shown: called 300 ms in, the load dialog
    up (a screenshot of it)."""
    if scan:
        controller.scan_models()
    t0 = time.time()
    w.load_models(None)
    if on_shown is not None:
        wait(300)
        on_shown()
    wait_until(lambda: not controller.loading, timeout)
    print("loaded", controller.info, f"{time.time() - t0:.1f}s", flush=True)
    return controller.ready


def idle(controller, w) -> bool:
    """No request running and no repaint pending."""
    return not controller.busy and not w.frame_timer.isActive()
