"""EngineHost and the engine process (engine/service/): message order, cancel, errors, loading, death."""
import os
import signal
import threading

import pytest

from app.host import death_sentence
from engine.api.config import SamplingParams, SpecParams
from engine.api.events import RoundEvent, Summary
from engine.api.protocol import EngineInfo
from engine.service.command_loop import Controls
from engine.service.describe import describe_error
from engine.service.loaders import Factory
from engine.service.process import spawn
from tests.app_fixtures import LOAD_TIMEOUT_MS, fake, fake_loader

MESSAGES = [{"role": "user", "content": "hello"}]


class Recorder:
    """What the handles of the requests it tracks say, in order."""

    def __init__(self):
        self.events = []
        self.batches = []
        self.threads = set()

    def track(self, req):
        rid = req.id
        req.rounds.connect(lambda evs: self.events.extend(("round", rid, ev) for ev in evs))
        req.rounds.connect(lambda evs: self.batches.append(len(evs)))
        req.rounds.connect(lambda *_: self.threads.add(threading.current_thread() is threading.main_thread()))
        req.summary.connect(lambda s: self.events.append(("summary", rid, s)))
        req.errored.connect(lambda msg: self.events.append(("error", rid, msg)))
        req.finished.connect(lambda: self.events.append(("finished", rid)))
        return req

    def kinds(self, rid):
        return [e[0] for e in self.events if e[1] == rid]


def test_message_order_and_payloads(qtbot, make_host, engine_log):
    host = make_host(fake(log=str(engine_log.path)))
    rec = Recorder()
    req = rec.track(host.generate(MESSAGES, SamplingParams(), SpecParams(k=4)))
    assert host.busy and host.pending[req.id] is req
    qtbot.waitUntil(lambda: not host.busy, timeout=5000)
    kinds = rec.kinds(req.id)
    assert kinds[-2:] == ["summary", "finished"] and set(kinds[:-2]) == {"round"}
    rounds = [e[2] for e in rec.events if e[0] == "round"]
    assert all(isinstance(r, RoundEvent) for r in rounds)
    assert [r.round for r in rounds] == list(range(1, len(rounds) + 1))
    summary = next(e[2] for e in rec.events if e[0] == "summary")
    assert isinstance(summary, Summary) and summary.text == "".join(r.text_delta for r in rounds)
    assert engine_log.requests == [MESSAGES]
    assert rec.threads == {True}  # every signal arrives in the GUI thread


def test_fast_rounds_are_batched_slow_ones_are_not(qtbot, make_host):
    fast = make_host()  # rounds in microseconds: batched
    rec = Recorder()
    req = rec.track(fast.generate(MESSAGES, SamplingParams(), SpecParams()))
    qtbot.waitUntil(lambda: not fast.busy, timeout=5000)
    summary = next(e[2] for e in rec.events if e[0] == "summary")
    assert sum(rec.batches) == summary.rounds and max(rec.batches) > 1
    assert [e[2].round for e in rec.events if e[0] == "round"] == list(range(1, summary.rounds + 1))
    assert rec.kinds(req.id)[-2:] == ["summary", "finished"]
    slow = make_host(fake(round_delay=0.03))  # slower than the batching window: one message per round
    rec = Recorder()
    rec.track(slow.generate(MESSAGES, SamplingParams(max_new_tokens=12), SpecParams()))
    qtbot.waitUntil(lambda: not slow.busy, timeout=5000)
    assert rec.batches and set(rec.batches) == {1}


def test_engine_runs_in_its_own_process(qtbot, make_host):
    host = make_host()
    assert host.pid is not None and host.pid != os.getpid() and host.process.is_alive()
    status = []
    host.statusReady.connect(status.append)
    host.query_status()
    qtbot.waitUntil(lambda: bool(status), timeout=5000)
    s = status[0]
    assert s.pid == host.pid and s.rss_bytes > 1_000_000
    assert s.target_free_blocks is None  # the scripted engine has no KV pools


def test_cancel_stops_between_rounds(qtbot, make_host, engine_log):
    host = make_host(fake(round_delay=0.05, log=str(engine_log.path)))
    rec = Recorder()
    req = rec.track(host.generate(MESSAGES, SamplingParams(), SpecParams()))
    qtbot.waitUntil(lambda: len(engine_log.seen) >= 2, timeout=5000)
    n = len(engine_log.seen)
    req.cancel()
    qtbot.waitUntil(lambda: not host.busy, timeout=5000)
    assert len(engine_log.seen) <= n + 1  # at most the round already in flight
    summary = next(e[2] for e in rec.events if e[0] == "summary")
    assert summary.stop_reason == "cancelled"


def test_controls_reach_the_running_request(qtbot, make_host, engine_log):
    host = make_host(fake(round_delay=0.03, log=str(engine_log.path)))
    req = host.generate(MESSAGES, SamplingParams(), SpecParams(k=4))
    qtbot.waitUntil(lambda: len(engine_log.seen) >= 2, timeout=5000)
    n = len(engine_log.seen)
    req.update(SamplingParams(temperature=0.5), SpecParams(k=2, drafter="ngram"))
    qtbot.waitUntil(lambda: not host.busy, timeout=5000)
    later = engine_log.seen[n + 1:]
    assert later and all((s.k, s.temperature, s.drafter) == (2, 0.5, "ngram") for s in later)


def test_cancelled_while_queued_never_runs(qtbot, make_host):
    host = make_host(fake(round_delay=0.02))
    rec = Recorder()
    first = rec.track(host.generate(MESSAGES, SamplingParams(max_new_tokens=6), SpecParams()))
    second = rec.track(host.generate(MESSAGES, SamplingParams(), SpecParams()))
    second.cancel()
    qtbot.waitUntil(lambda: not host.busy, timeout=5000)
    assert rec.kinds(second.id) == ["finished"]
    assert "summary" in rec.kinds(first.id)


def test_engine_exception_becomes_errored(qtbot, make_host):
    host = make_host(fake(fail_at_round=3))
    rec = Recorder()
    req = rec.track(host.generate(MESSAGES, SamplingParams(), SpecParams()))
    qtbot.waitUntil(lambda: not host.busy, timeout=5000)
    assert rec.kinds(req.id) == ["round", "round", "error", "finished"]
    assert "scripted engine failure" in rec.events[2][2]
    assert host.running and host.ready  # an engine error is not a crash


def test_generate_without_engine_errors(qtbot, make_host):
    host = make_host(load=False)
    assert not host.ready
    rec = Recorder()
    req = rec.track(host.generate(MESSAGES, SamplingParams(), SpecParams()))
    qtbot.waitUntil(lambda: not host.busy, timeout=LOAD_TIMEOUT_MS)
    assert rec.kinds(req.id) == ["error", "finished"] and "no model" in rec.events[0][2]


def test_background_load_reports_progress(qtbot, make_host):
    host = make_host(fake(steps=5, expect=("/models/t", "/models/d", "cpu")), load=False)
    stages = []
    host.loadProgress.connect(lambda s, f: stages.append((s, f)))
    loaded = []
    host.loaded.connect(loaded.append)
    host.load("/models/t", "/models/d", "cpu")
    qtbot.waitUntil(lambda: bool(loaded), timeout=LOAD_TIMEOUT_MS)
    assert loaded[0] == EngineInfo("fake-target", "fake-draft", "cpu", "float32")
    assert host.ready and host.info.target_name == "fake-target" and host.loading is None
    assert host.last_load.target == "/models/t"
    assert stages[0] == ("step 0", 0.0) and stages[-1] == ("step 4", 1.0)


def test_failed_load_keeps_previous_engine(qtbot, make_host):
    host = make_host()  # fake_loader: the default pair loads, a named path does not exist
    pid = host.pid
    failed = []
    host.loadFailed.connect(failed.append)
    host.load("/nope")
    qtbot.waitUntil(lambda: bool(failed), timeout=5000)
    assert failed[0] == "/nope: no config.json, *.safetensors or .gguf found"
    assert host.info.target_name == "fake-target" and host.pid == pid and host.last_load.target is None
    rec = Recorder()
    req = rec.track(host.generate(MESSAGES, SamplingParams(), SpecParams()))
    qtbot.waitUntil(lambda: not host.busy, timeout=5000)
    assert "summary" in rec.kinds(req.id)


def test_cancelled_load(qtbot, make_host, tmp_path):
    gate = tmp_path / "gate"
    host = make_host(fake(gate=str(gate)), load=False)
    stages, cancelled = [], []
    host.loadProgress.connect(lambda s, f: stages.append(s))
    host.loadCancelled.connect(lambda: cancelled.append(True))
    host.load(None)
    qtbot.waitUntil(lambda: "Converting target" in stages, timeout=LOAD_TIMEOUT_MS)
    host.cancel_load()
    qtbot.wait(100)
    gate.touch()
    qtbot.waitUntil(lambda: bool(cancelled), timeout=5000)
    assert host.loading is None and not host.ready


def test_scan_models(qtbot, make_host):
    host = make_host(load=False, models=["m1", "m2"])
    listed = []
    host.modelsListed.connect(listed.append)
    host.scan_models()
    qtbot.waitUntil(lambda: bool(listed), timeout=LOAD_TIMEOUT_MS)
    assert listed[0] == ["m1", "m2"]


def test_reset_runs_in_the_engine(qtbot, make_host, engine_log):
    host = make_host(fake(log=str(engine_log.path)))
    host.reset()
    qtbot.waitUntil(lambda: engine_log.resets == 1, timeout=5000)


def test_killed_process_is_reported_once_in_one_sentence(qtbot, make_host):
    host = make_host(fake(round_delay=0.05))
    rec = Recorder()
    died = []
    host.died.connect(died.append)
    req = rec.track(host.generate(MESSAGES, SamplingParams(), SpecParams()))
    qtbot.waitUntil(lambda: bool(rec.events), timeout=5000)
    os.kill(host.pid, signal.SIGKILL)
    qtbot.waitUntil(lambda: bool(died), timeout=5000)
    qtbot.wait(50)
    assert died == ["The engine process was killed (SIGKILL). The system sends it when memory runs out; "
                    "check free memory before reloading."]
    assert "finished" not in rec.kinds(req.id)  # the controller decides what an interrupted request becomes
    assert not host.running and not host.ready and not host.busy
    assert host.last_load is not None  # what reload() loads again
    host.reload()
    qtbot.waitUntil(lambda: host.ready, timeout=LOAD_TIMEOUT_MS)
    req = rec.track(host.generate(MESSAGES, SamplingParams(), SpecParams()))
    qtbot.waitUntil(lambda: not host.busy, timeout=5000)
    assert rec.kinds(req.id)[-2:] == ["summary", "finished"]


def test_death_while_loading_is_reported_and_reload_tries_that_pair_again(qtbot, make_host):
    host = make_host(fake(die_loading="/models/crashing", expect=(None, None, None)))
    died, failed = [], []
    host.died.connect(died.append)
    host.loadFailed.connect(failed.append)
    host.load("/models/crashing")
    qtbot.waitUntil(lambda: bool(died), timeout=5000)
    assert died == ["The engine process exited unexpectedly with status 3."] and failed == []
    assert host.loading is None and not host.ready and host.last_load.target == "/models/crashing"
    host.reload()
    qtbot.waitUntil(lambda: len(died) == 2, timeout=LOAD_TIMEOUT_MS)  # it dies loading it again


def test_failure_of_the_engine_loop_is_reported_with_its_message(qtbot, qapp):
    from app.host import EngineHost

    host = EngineHost(fake(), Factory("tests.app.test_host:broken_lister"))
    died = []
    host.died.connect(died.append)
    host.start()
    host.scan_models()
    qtbot.waitUntil(lambda: bool(died), timeout=LOAD_TIMEOUT_MS)
    assert died == ["The engine process failed: EngineLoopBug: the loop itself broke"]
    assert host.shutdown(1)


def marking_loader(*args):
    _mark("load")
    return fake_loader(*args)


def warm_marked():
    _mark("warm")


def warm_broken():
    _mark("warm")
    raise ImportError("no module named 'heavy'")


def _mark(what: str) -> None:
    with open(os.environ["SPECLENS_TEST_MARKS"], "a") as f:
        f.write(f"{what} {os.getpid()}\n")


@pytest.mark.parametrize("warm", ["warm_marked", "warm_broken"])
def test_a_process_spawned_before_qt_is_taken_over_and_warmed_before_its_first_job(qtbot, qapp, tmp_path,
                                                                                 monkeypatch, warm):
    """main() spawns the engine process before importing Qt; the host adopts it instead of starting a second one.
    The loader's warm-up runs in the child before the first job; a warm-up that fails only logs."""
    from app.host import EngineHost

    marks = tmp_path / "marks"
    monkeypatch.setenv("SPECLENS_TEST_MARKS", str(marks))  # inherited by the spawned child
    loader = Factory("tests.app.test_host:marking_loader", warm=f"tests.app.test_host:{warm}")
    lister = Factory("tests.app_fixtures:listed_models", {"names": []})
    proc, conn = spawned = spawn(loader, lister)
    host = EngineHost(loader, lister, spawned=spawned)
    try:
        host.start()
        assert host.process is proc and host._conn is conn
        host.start()  # running: nothing new
        assert host.process is proc
        host.load()
        qtbot.waitUntil(lambda: host.ready or host.loading is None, timeout=LOAD_TIMEOUT_MS)
        assert host.ready and host.pid == proc.pid
        assert marks.read_text().split("\n")[:2] == [f"warm {proc.pid}", f"load {proc.pid}"]
    finally:
        assert host.shutdown(5)
    host.start()  # after a shutdown: a new process, not the adopted one again
    try:
        assert host.process is not proc and host.process.is_alive()
    finally:
        assert host.shutdown(5)


def test_a_status_that_says_idle_was_counted_after_the_last_job(monkeypatch):
    """status() runs in the command thread while a job may be ending in the main thread. If the job ends while
    the KV blocks are being counted, the answer must say busy: "idle" promises counts taken after every job sent
    before the query (the soak test relies on it after its last reset)."""
    import engine.service.status as status
    from engine.service.command_loop import Service

    svc = Service(None, fake(), Factory("tests.app_fixtures:listed_models"))
    svc._unfinished = 1  # a reset runs in the main thread
    counted = status._blocks

    def job_ends_meanwhile(pool):
        svc._unfinished = 0
        return counted(pool)

    monkeypatch.setattr(status, "_blocks", job_ends_meanwhile)
    assert svc.status().busy
    assert not svc.status().busy


class EngineLoopBug(BaseException):
    """Not an Exception: nothing in the service catches it before its main loop does."""


def broken_lister():
    raise EngineLoopBug("the loop itself broke")


def test_clean_shutdown_is_not_a_death(qtbot, make_host):
    host = make_host()
    died = []
    host.died.connect(died.append)
    assert host.shutdown(5)
    qtbot.wait(200)
    assert died == [] and not host.running


def test_shutdown_ends_the_process_without_the_interpreters_teardown(qtbot, make_host, tmp_path):
    """The loop ends within a round of Shutdown; the interpreter's teardown after it (unloading torch, walking
    every object the models made) outlasted the GUI's wait on a busy machine. The process skips it, exiting 0."""
    from engine.service.loaders import Factory

    marker = tmp_path / "teardown"
    host = make_host(Factory("tests.app_fixtures:teardown_marking_loader", {"marker": str(marker)}))
    proc = host.process
    assert host.shutdown(5)
    assert proc.exitcode == 0 and not marker.exists()


@pytest.mark.parametrize("exitcode, fatal, text", [
    (-9, None, "The engine process was killed (SIGKILL). The system sends it when memory runs out; "
               "check free memory before reloading."),
    (-11, None, "The engine process crashed (SIGSEGV: a fault in native code)."),
    (-15, None, "The engine process was stopped by SIGTERM."),
    (1, "MemoryError", "The engine process failed: MemoryError"),
    (3, None, "The engine process exited unexpectedly with status 3."),
    (0, None, "The engine process exited unexpectedly."),
])
def test_death_sentence(exitcode, fatal, text):
    assert death_sentence(exitcode, fatal) == text


@pytest.mark.parametrize("exc, text", [
    (type("ModelLoadError", (Exception,), {})("bad folder"), "bad folder"),
    (ValueError("K must be >= 1"), "ValueError: K must be >= 1"),
])
def test_describe_error(exc, text):
    assert describe_error(exc) == text


def test_service_shares_the_engines_controls_without_importing_torch():
    """The command reader holds the engine's own Controls class (engine/api/live.py), and importing the service
    (as a spawned engine process does before it loads anything) pulls in no torch."""
    import subprocess
    import sys

    from engine.runtime.engine import Controls as EngineControls

    assert Controls is EngineControls
    code = "import sys, engine.service.process; assert 'torch' not in sys.modules, 'torch imported'"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0
