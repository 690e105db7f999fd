"""Entry point (`speclens`, or `python -m app.main`): the window shows at once, models load behind it, in the
engine's own process (app/host.py)."""
from __future__ import annotations

import argparse
import gc
import logging
import multiprocessing
import os
import sys
import time


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="speclens", description="Chat over a speculative-decoding engine and "
                                 "watch every token: accepted drafts, corrections, bonus tokens.")
    ap.add_argument("--target", help="target model: a folder, a .gguf file or a cached Hugging Face repo id "
                    "(default: the embedded pair)")
    ap.add_argument("--draft", help="draft model for --target (default: none; the n-gram drafter still works)")
    ap.add_argument("--device", help="cpu or cuda (default: cuda when available)")
    ap.add_argument("--settings", metavar="INI", help="keep settings in this INI file instead of the user's")
    ap.add_argument("--smoke-test", action="store_true",
                    help="open the window (offscreen when there is no display), start the event loop, quit; "
                    "loads no model")
    ap.add_argument("--load-test", action="store_true",
                    help="open the window (offscreen when there is no display), load the models as a launch does "
                    "(the embedded pair unless --target), print how long that took and quit; exit status 1 if "
                    "the load fails")
    ap.add_argument("--attach", metavar="URL", help="show the speculation of a running llama-server or vLLM at URL "
                    "instead of loading the local pair (API key: $SPECLENS_API_KEY); with --load-test: connect, "
                    "read its models, say so and quit")
    ap.add_argument("--plain-server", metavar="URL", help="with --attach: the same model served without a draft "
                    "(Compare's plain side)")
    ap.add_argument("trace", nargs="?", metavar="TRACE.json",
                    help="show a saved session trace (File > Save trace); no model is loaded")
    args = ap.parse_args(argv)
    if args.draft and not args.target:
        ap.error("--draft needs --target")
    if args.trace and args.target:
        ap.error("a trace needs no model: leave out --target")
    if args.load_test and (args.smoke_test or args.trace):
        ap.error("--load-test loads models: leave out --smoke-test and the trace")
    if args.attach and (args.target or args.trace or args.smoke_test):
        ap.error("--attach uses the server's models: leave out --target, --smoke-test and the trace")
    if args.plain_server and not args.attach:
        ap.error("--plain-server needs --attach")
    return args


def main(argv: list[str] | None = None) -> int:
    multiprocessing.freeze_support()  # a frozen (PyInstaller) build runs the engine process through here
    started = time.perf_counter()
    args = parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    problem = display_problem(unattended=args.smoke_test or args.load_test)
    if problem:  # Qt would abort without saying which system package is missing
        print(problem, file=sys.stderr)
        return 1
    spawned = None
    if not args.smoke_test and not args.trace and not args.attach:
        from engine.service.process import spawn

        # First, before Qt: the engine process imports torch and loads the kernels (~1.3 s) while this one
        # imports Qt and builds the window (~0.6 s)
        spawned = spawn()
    app = application()
    if args.trace:  # a saved session alone: no engine process, no model
        from app.dialogs.trace_window import open_trace_cli

        return open_trace_cli(app, args.trace, smoke_test=args.smoke_test)
    return run_window(app, args, spawned, started)


def display_problem(unattended: bool) -> str | None:
    """Why Qt could not open a window here (None: it can). A scripted run with no display goes offscreen."""
    if unattended and not os.environ.get("DISPLAY") and not os.environ.get("WAYLAND_DISPLAY"):
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from app.platform_check import check_display, check_xcb, needs_xcb

    return (check_xcb() or check_display()) if needs_xcb() else None


def application():
    """The QApplication, named and styled. Qt is imported here, after the engine process was spawned."""
    from PySide6.QtWidgets import QApplication

    from app import __version__
    from app.views.resources import app_icon

    app = QApplication.instance() or QApplication(sys.argv[:1])
    app.setApplicationName("SpecLens")
    app.setOrganizationName("SpecLens")
    app.setApplicationVersion(__version__)
    app.setDesktopFileName("speclens")
    app.setStyle("Fusion")
    app.setWindowIcon(app_icon())
    return app


def run_window(app, args: argparse.Namespace, spawned, started: float) -> int:
    """The main window over an engine process (`spawned`, or one started now), until it closes."""
    from PySide6.QtCore import QSettings, QTimer

    from app.controller import ChatController
    from app.host import EngineHost
    from app.views.window import MainWindow

    settings = QSettings(args.settings, QSettings.Format.IniFormat) if args.settings else QSettings()
    controller = ChatController(EngineHost(spawned=spawned))
    window = MainWindow(controller, settings, unattended=args.load_test)
    window.show()
    # What is alive now (Qt, pyqtgraph, numpy: ~90k objects) lives as long as the app. Leave it out of the
    # garbage collector's full passes, which would otherwise walk it all mid-reply (~35-60 ms measured on a
    # 2-vCPU VM, against the GUI's 50 ms stall goal); they then walk only what the session creates.
    gc.freeze()

    result = {"code": 0}
    if args.smoke_test:
        QTimer.singleShot(0, lambda: smoke_check(app, window, result))
    elif args.attach:  # the local engine starts only on Detach
        if args.load_test:
            report_attach(app, window, args.attach, result)
        QTimer.singleShot(0, lambda: controller.attach(args.attach, args.plain_server))
    else:
        if args.load_test:
            report_load(app, window, controller, started, result)
        # the engine runs jobs in order: the load first, the model picker's list after it
        QTimer.singleShot(0, lambda: window.load_models(args.target, args.draft, args.device))
        QTimer.singleShot(0, controller.scan_models)

    code = app.exec() or result["code"]
    if not controller.shutdown():  # e.g. a load that cannot be interrupted: the process was killed
        logging.getLogger("speclens").warning("the engine process did not stop in time and was killed")
    return code


def smoke_check(app, window, result: dict[str, int]) -> None:
    """--smoke-test: the window and its panels are on screen; say so and quit."""
    ok = window.isVisible() and window.chat.isVisible() and window.charts.isVisible()
    print(f"smoke-test {'ok' if ok else 'FAILED'}: window {window.width()}x{window.height()}, "
          f"platform {app.platformName()}", flush=True)
    result["code"] = 0 if ok else 1
    window.close()
    app.quit()


def report_load(app, window, controller, started: float, result: dict[str, int]) -> None:
    """--load-test: once the load ends, one line saying how, then quit (status 1 if it failed)."""
    def done(code: int, line: str, notice: str = "") -> None:
        if notice:  # e.g. no compiled kernels: the sentence the window shows, before the verdict line
            print(notice, flush=True)
        print(line, flush=True)
        result["code"] = code
        window.close()
        app.quit()

    controller.loaded.connect(lambda info: done(0, (
        f"load-test ok: {info.target_name} + {info.draft_name or 'no draft'} on {info.device} "
        f"({info.dtype_name}), loaded {time.perf_counter() - started:.1f} s after start"), info.notice))
    controller.loadFailed.connect(lambda message: done(1, f"load-test failed: {message}"))
    controller.engineDied.connect(lambda sentence: done(1, f"load-test failed: {sentence}"))


def report_attach(app, window, url: str, result: dict[str, int]) -> None:
    """--attach URL --load-test: once the server answered (or did not), one line saying so, then quit."""
    def done(code: int, line: str) -> None:
        print(line, flush=True)
        result["code"] = code
        window.close()
        app.quit()

    def ok(_info) -> None:
        server = window.controller.remote.server
        k = f", K {server.k}" if server.k else ""
        k += {True: ", a draft model in its slots", False: ", no draft model"}.get(server.speculative, "")
        k += {True: ", K and on/off per request", False: ", per-request speculative fields ignored"}.get(
            server.per_request_spec, "")
        counters = server.counters
        spec = (f"{counters.draft_tokens} drafted / {counters.accepted_tokens} accepted so far" if counters else
                "no speculation counters in /metrics" if server.metrics_ok else "no /metrics")
        done(0, f"load-test ok: attached to {server.label}: models {', '.join(server.models) or '(none)'}{k}; "
                f"{spec}")

    window.controller.loaded.connect(ok)
    window.controller.attachFailed.connect(lambda message: done(1, f"load-test failed: {message}"))


if __name__ == "__main__":
    sys.exit(main())
