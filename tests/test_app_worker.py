"""EngineWorker / EngineHost: signal order, cancel, errors, background loading."""
import threading

import pytest
from PySide6.QtCore import QThread

from app.worker import EngineInfo, describe_error
from engine.config import SamplingParams, SpecParams
from engine.events import RoundEvent, Summary
from tests.app_fixtures import *  # noqa: F401,F403
from tests.app_fixtures import FakeEngine, SignalLog

MESSAGES = [{"role": "user", "content": "hello"}]


class Recorder:
    def __init__(self, worker):
        self.events = []
        self.batches = []
        worker.roundsReady.connect(lambda rid, evs: self.events.extend(("round", rid, ev) for ev in evs))
        worker.roundsReady.connect(lambda rid, evs: self.batches.append(len(evs)))
        worker.summaryReady.connect(lambda rid, s: self.events.append(("summary", rid, s)))
        worker.errored.connect(lambda rid, msg: self.events.append(("error", rid, msg)))
        worker.finished.connect(lambda rid: self.events.append(("finished", rid)))

    def kinds(self, rid):
        return [e[0] for e in self.events if e[1] == rid]


def test_signal_order_and_payloads(qtbot, make_host):
    engine = FakeEngine()
    host = make_host(engine)
    rec = Recorder(host.worker)
    req = host.generate(MESSAGES, SamplingParams(), SpecParams(k=4))
    assert host.busy and host.pending[req.id] is req
    qtbot.waitUntil(lambda: not host.busy, timeout=5000)
    kinds = rec.kinds(req.id)
    assert kinds[-2:] == ["summary", "finished"] and set(kinds[:-2]) == {"round"}
    rounds = [e[2] for e in rec.events if e[0] == "round"]
    assert all(isinstance(r, RoundEvent) for r in rounds)
    assert [r.round for r in rounds] == list(range(1, len(rounds) + 1))
    summary = next(e[2] for e in rec.events if e[0] == "summary")
    assert isinstance(summary, Summary) and summary.text == "".join(r.text_delta for r in rounds)
    assert engine.requests == [MESSAGES]


def test_fast_rounds_are_batched_slow_ones_are_not(qtbot, make_host):
    fast = make_host(FakeEngine())  # rounds in microseconds: batched
    rec = Recorder(fast.worker)
    req = fast.generate(MESSAGES, SamplingParams(), SpecParams())
    qtbot.waitUntil(lambda: not fast.busy, timeout=5000)
    summary = next(e[2] for e in rec.events if e[0] == "summary")
    assert sum(rec.batches) == summary.rounds and max(rec.batches) > 1
    assert [e[2].round for e in rec.events if e[0] == "round"] == list(range(1, summary.rounds + 1))
    assert rec.kinds(req.id)[-2:] == ["summary", "finished"]
    slow = make_host(FakeEngine(round_delay=0.03))  # slower than the batching window: one signal per round
    rec = Recorder(slow.worker)
    slow.generate(MESSAGES, SamplingParams(max_new_tokens=12), SpecParams())
    qtbot.waitUntil(lambda: not slow.busy, timeout=5000)
    assert rec.batches and set(rec.batches) == {1}


def test_worker_runs_off_the_gui_thread(qtbot, make_host):
    seen = []

    class ThreadSpy(FakeEngine):
        def encode_chat(self, messages):
            seen.append(threading.current_thread() is threading.main_thread())
            return super().encode_chat(messages)

    host = make_host(ThreadSpy())
    assert host.worker.thread() is host.thread and host.thread is not QThread.currentThread()
    done = SignalLog(host.worker.finished)
    host.generate(MESSAGES, SamplingParams(), SpecParams())
    done.wait(qtbot)
    assert seen == [False]


def test_cancel_stops_between_rounds(qtbot, make_host):
    engine = FakeEngine(round_delay=0.05)
    host = make_host(engine)
    rec = Recorder(host.worker)
    req = host.generate(MESSAGES, SamplingParams(), SpecParams())
    qtbot.waitUntil(lambda: len(engine.seen) >= 2, timeout=5000)
    n = len(engine.seen)
    req.cancel()
    qtbot.waitUntil(lambda: not host.busy, timeout=5000)
    assert len(engine.seen) <= n + 1  # at most the round already in flight
    summary = next(e[2] for e in rec.events if e[0] == "summary")
    assert summary.stop_reason == "cancelled"


def test_cancelled_while_queued_never_runs(qtbot, make_host):
    engine = FakeEngine(round_delay=0.02)
    host = make_host(engine)
    rec = Recorder(host.worker)
    first = host.generate(MESSAGES, SamplingParams(max_new_tokens=6), SpecParams())
    second = host.generate(MESSAGES, SamplingParams(), SpecParams())
    second.cancel()
    qtbot.waitUntil(lambda: not host.busy, timeout=5000)
    assert rec.kinds(second.id) == ["finished"]
    assert "summary" in rec.kinds(first.id)


def test_engine_exception_becomes_errored(qtbot, make_host):
    host = make_host(FakeEngine(fail_at_round=3))
    rec = Recorder(host.worker)
    req = host.generate(MESSAGES, SamplingParams(), SpecParams())
    qtbot.waitUntil(lambda: not host.busy, timeout=5000)
    assert rec.kinds(req.id) == ["round", "round", "error", "finished"]
    assert "scripted engine failure" in rec.events[2][2]


def test_generate_without_engine_errors(qtbot, make_host):
    host = make_host(None)
    assert not host.ready
    rec = Recorder(host.worker)
    req = host.generate(MESSAGES, SamplingParams(), SpecParams())
    qtbot.waitUntil(lambda: not host.busy, timeout=5000)
    assert rec.kinds(req.id) == ["error", "finished"] and "no model" in rec.events[0][2]


def test_background_load_reports_progress(qtbot, make_host):
    engine = FakeEngine()

    def loader(target, draft, device, progress, cancelled):
        assert threading.current_thread() is not threading.main_thread()
        for i in range(5):
            progress(f"step {i}", i / 4)
        assert (target, draft, device) == ("/models/t", "/models/d", "cpu")
        return engine

    host = make_host(None, loader=loader)
    stages = []
    host.worker.loadProgress.connect(lambda s, f: stages.append((s, f)))
    loaded = SignalLog(host.worker.loaded)
    host.load("/models/t", "/models/d", "cpu")
    assert loaded.wait(qtbot)[0] == EngineInfo("fake-target", "fake-draft", "cpu", "float32")
    qtbot.waitUntil(lambda: host.ready, timeout=5000)  # the host hears it through the GUI thread's event loop
    assert host.ready and host.info.target_name == "fake-target" and host.loading is None
    assert stages[0] == ("step 0", 0.0) and stages[-1] == ("step 4", 1.0)
    assert host.worker.engine is engine


def test_failed_load_keeps_previous_engine(qtbot, make_host):
    class ModelLoadError(Exception):
        pass

    def loader(*_):
        raise ModelLoadError("/nope: no config.json or .gguf here")

    old = FakeEngine()
    host = make_host(old, loader=loader)
    failed = SignalLog(host.worker.loadFailed)
    host.load("/nope")
    assert failed.wait(qtbot)[0] == "/nope: no config.json or .gguf here"
    assert host.worker.engine is old and host.info.target_name == "fake-target"


def test_cancelled_load(qtbot, make_host):
    gate = threading.Event()

    def loader(target, draft, device, progress, cancelled):
        gate.wait(5)
        if cancelled():
            raise RuntimeError("cancelled")  # what provisioning does when asked to stop
        return FakeEngine()

    host = make_host(None, loader=loader)
    cancelled = SignalLog(host.worker.loadCancelled)
    host.load(None)
    host.cancel_load()
    gate.set()
    cancelled.wait(qtbot)
    qtbot.waitUntil(lambda: host.loading is None, timeout=5000)
    assert not host.ready


def test_scan_models(qtbot, make_host):
    host = make_host(None, lister=lambda: ["m1", "m2"])
    listed = SignalLog(host.worker.modelsListed)
    host.scan_models()
    assert listed.wait(qtbot)[0] == ["m1", "m2"]


def test_reset_runs_in_worker(qtbot, make_host):
    engine = FakeEngine()
    host = make_host(engine)
    host.reset()
    qtbot.waitUntil(lambda: engine.resets == 1, timeout=5000)


@pytest.mark.parametrize("exc, text", [
    (type("ModelLoadError", (Exception,), {})("bad folder"), "bad folder"),
    (ValueError("K must be >= 1"), "ValueError: K must be >= 1"),
])
def test_describe_error(exc, text):
    assert describe_error(exc) == text
