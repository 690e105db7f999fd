"""The engine's own process: started with the "spawn" context, it serves commands over a multiprocessing Pipe.
No Qt here, and no torch at import.

The GUI (app/host.py) calls `spawn`, so the GUI's interpreter never hosts torch, and a crash, a segfault in native
code or an OOM kill in the child cannot take the window down. The messages are engine.api.protocol's; the
child's loop is engine/service/command_loop.py. Before its first job the child runs the loader's warm-up
(`Factory.warm`: for the real engine, importing torch and loading the kernels), so a child started early does
that while the GUI is still starting.
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import traceback
from typing import Any

from engine.api.protocol import Fatal
from engine.service.command_loop import Service
from engine.service.describe import describe_error
from engine.service.loaders import DEFAULT_LISTER, DEFAULT_LOADER, Factory

log = logging.getLogger(__name__)


def spawn(loader: Factory = DEFAULT_LOADER, lister: Factory = DEFAULT_LISTER) -> tuple[Any, Any]:
    """Start `serve` in a child made with the "spawn" context (never fork a process that runs Qt). Returns the
    process and the parent's end of the pipe. Needs no Qt, so the GUI can call it before importing Qt and the
    child imports torch while the window is built."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=serve, args=(child, loader, lister), name="speclens-engine", daemon=True)
    proc.start()
    child.close()  # our copy: the pipe reports EOF once the child's end is gone
    return proc, parent


def serve(conn: Any, loader: Factory = DEFAULT_LOADER, lister: Factory = DEFAULT_LISTER) -> None:
    """The child process's entry point: the command loop until Shutdown; Fatal and status 1 if the loop fails."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s engine %(name)s: %(message)s")
    try:
        Service(conn, loader, lister).run()
    except BaseException as e:  # noqa: BLE001 - tell the GUI why, then exit non-zero
        log.error("engine loop failed:\n%s", traceback.format_exc())
        try:
            conn.send(Fatal(describe_error(e)))
        except OSError:
            pass
        raise SystemExit(1) from e
    exit_now(conn)


def _stop_builds() -> None:
    """engine.cpu.build's stop_builds, if this process ever imported it (a process that loaded no model did not:
    importing it now would only cost time)."""
    build = sys.modules.get("engine.cpu.build")
    if build is None:
        return
    try:
        stopped = build.stop_builds()
    except Exception:  # noqa: BLE001 - quitting goes on: the build then finishes on its own, as after a kill
        log.warning("could not stop the kernel build:\n%s", traceback.format_exc())
        return
    if stopped:
        log.info("stopped the kernel build this process started (the app is closing; the next start builds again)")


def exit_now(conn: Any) -> None:
    """End the process once the loop has ended on Shutdown, skipping the interpreter's teardown. That teardown
    unloads torch and walks every object the models made: far longer than the loop takes to end (within a
    round), and on a machine whose cores are busy long enough to outlast the GUI's wait, which then killed the
    process. Nothing in here needs it: the replies, traces and exports are the GUI's to write, the models
    and KV pages are memory the OS takes back, and the kernel build's lock is released where it is taken. A kernel
    build this process started and still runs (a load cancelled mid-compile) ends with it: the app that asked
    for it is closing."""
    _stop_builds()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):  # no console (a windowed bundle) or already closed
            pass
    try:
        conn.close()
    except OSError:
        pass
    os._exit(0)
