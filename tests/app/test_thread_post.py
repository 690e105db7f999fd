"""Worker threads and the QObjects they post to (app/thread_post.py): once an owner shuts a thread's way to the
GUI thread, the thread touches nothing, so the object can be deleted while the thread still runs. CI once died of
a segmentation fault when a cancelled server probe emitted on a host that deleteLater was destroying."""
from __future__ import annotations

import socket
import threading
import time

import shiboken6

from app.remote_host import RemoteHost
from app.thread_post import ThreadPost
from engine.remote.errors import RemoteError


def test_close_waits_for_an_emit_in_flight_then_nothing_is_touched():
    mail, calls = ThreadPost(), []
    entered, release = threading.Event(), threading.Event()

    def slow_emit(x):
        entered.set()
        release.wait(5)
        calls.append(x)

    poster = threading.Thread(target=mail.post, args=(slow_emit, 1))
    poster.start()
    assert entered.wait(5)
    closer = threading.Thread(target=mail.close)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive()  # the emit in flight still holds the object: close may not return yet
    release.set()
    closer.join(5)
    poster.join(5)
    assert not closer.is_alive() and calls == [1] and mail.closed
    assert mail.post(calls.append, 2) is False and calls == [1]


def test_a_probe_ending_after_shutdown_touches_nothing_even_once_the_host_is_deleted(qapp, qtbot):
    """The controller's cancelled connect: shutdown, deleteLater, and the probe answers afterwards."""
    answer, started = threading.Event(), threading.Event()

    class SlowClient:
        public = "http://slow.invalid"
        info = None

        def probe(self):
            started.set()
            answer.wait(5)
            raise RemoteError("it answered too late")

        def abort(self):
            pass

    posted, errors = [], []
    hook, threading.excepthook = threading.excepthook, lambda args: errors.append(args.exc_value)
    try:
        remote = RemoteHost("http://127.0.0.1:9")
        remote.client = SlowClient()
        remote._emit = posted.append  # the threads' only way to the object: record instead
        remote.connect_server()
        assert started.wait(5)
        thread = remote._threads[0]
        remote.shutdown(0.0)
        remote.deleteLater()
        qtbot.waitUntil(lambda: not shiboken6.isValid(remote), timeout=5000)
        answer.set()
        thread.join(5)
    finally:
        threading.excepthook = hook
    assert not thread.is_alive() and posted == [] and errors == []


def test_shutdown_ends_a_probe_of_a_silent_server_at_once(qapp):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(4)  # the kernel accepts; nothing ever answers
    try:
        remote = RemoteHost(f"http://127.0.0.1:{silent.getsockname()[1]}", connect_s=30.0, read_s=30.0)
        remote.connect_server()
        time.sleep(0.2)
        assert remote.shutdown(3.0)  # its probe ended: aborted, not left to its 30 s connect bound
        remote.deleteLater()
    finally:
        silent.close()


def test_a_gate_within_a_closed_gate_and_an_emit_on_a_deleted_object_post_nothing():
    outer, calls = ThreadPost(), []
    inner = ThreadPost(outer)
    assert inner.post(calls.append, 1) and calls == [1]
    outer.close()
    assert inner.post(calls.append, 2) is False and inner.closed and calls == [1]

    def deleted(_):
        raise RuntimeError("Signal source has been deleted")

    gate = ThreadPost()
    assert gate.post(deleted, 3) is False and gate.closed


def test_an_engine_host_deleted_without_shutdown_leaves_its_reader_nothing_to_touch(qapp, qtbot):
    """As a window's host goes with its window: the reader still reads the pipe, then ends quietly."""
    from multiprocessing import Pipe

    from app.host import EngineHost

    host = EngineHost()
    ours, theirs = Pipe()
    errors = []
    hook, threading.excepthook = threading.excepthook, lambda args: errors.append(args.exc_value)
    try:
        reader = threading.Thread(target=host._read, args=(None, ours, host._mail))
        reader.start()
        host.deleteLater()
        qtbot.waitUntil(lambda: not shiboken6.isValid(host), timeout=5000)
        theirs.send("a message after the host went")
        theirs.close()  # then the pipe closes: the reader's last post is that it was lost
        reader.join(5)
    finally:
        threading.excepthook = hook
    assert not reader.is_alive() and errors == []
