"""The draft finder in its own process, for the window: started with the "spawn" context (never fork a process that
runs Qt), it runs one finder call and tells its progress and its result over a multiprocessing Pipe. No Qt here,
and no torch at import.

The finder loads each candidate beside the target, so it runs apart from the engine process: the pair the user
chats with stays loaded and untouched, and a candidate that crashes native code ends this process, not the window
or the engine. Messages child -> parent: ("progress", stage, fraction), then one of ("done", result JSON) or
("failed", sentence). Parent -> child: "cancel" (also implied when the parent's end closes).
"""
from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import threading
from typing import Any

from engine.service.loaders import Factory

log = logging.getLogger(__name__)

FINDER = Factory("engine.tools.draft_finder:find_drafts_json")
CANCEL = "cancel"


def spawn(finder: Factory = FINDER) -> tuple[Any, Any]:
    """Start `serve` in a spawned child. Returns the process and the parent's end of the pipe."""
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=serve, args=(child, finder), name="speclens-draft-finder", daemon=True)
    proc.start()
    child.close()  # our copy: the pipe reports EOF once the child's end is gone
    return proc, parent


def serve(conn: Any, finder: Factory) -> None:
    """The child's entry point: run the finder, answering a cancel between its rounds; then exit at once."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s draft finder %(name)s: %(message)s")
    stop = threading.Event()

    def listen() -> None:
        try:
            while not stop.is_set():
                if conn.recv() == CANCEL:
                    stop.set()
        except (EOFError, OSError):  # the window went away: nobody wants the result
            stop.set()

    threading.Thread(target=listen, name="speclens-draft-finder-cancel", daemon=True).start()
    try:
        result = finder.resolve()(progress=lambda stage, fraction: _send(conn, ("progress", stage, fraction)),
                                  cancelled=stop.is_set)
        _send(conn, ("done", result))
    except BaseException as e:  # whatever ends the finder, the window is told why in one line
        log.warning("the draft finder failed", exc_info=True)
        _send(conn, ("failed", str(e).replace("\n", " ") or type(e).__name__))
    _exit_now(conn)


def _send(conn: Any, message: tuple) -> None:
    try:
        conn.send(message)
    except (OSError, ValueError):  # the window closed its end
        pass


def _exit_now(conn: Any) -> None:
    """Skip the interpreter's teardown (torch's is long): the result is sent, the models are the OS's to free."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (AttributeError, OSError, ValueError):
            pass
    try:
        conn.close()
    except OSError:
        pass
    os._exit(0)
