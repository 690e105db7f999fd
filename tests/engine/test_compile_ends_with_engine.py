"""A kernel compile the engine process started ends when that process quits (the app closing), even after its
load was cancelled and the compile left to run on; it is not left compiling with no window.

The compiler is a fake that records its pid and sleeps, as in tests/kernels/test_kernel_build.py: what matters
is the processes, not what they build."""
from __future__ import annotations

import os
import textwrap
import time
from pathlib import Path

import pytest

from engine.api.protocol import Load, LoadCancelled, Shutdown, Started
from engine.cpu import build
from engine.service.loaders import Factory
from engine.service.process import spawn

LISTER = Factory("tests.app_fixtures:listed_models", {"names": []})
START_S = 120  # the build child imports torch before it runs a compiler: seconds, more on a busy machine


@pytest.fixture
def sleeping_compiler(tmp_path, monkeypatch) -> Path:
    """CXX: a compiler that writes its pid to the returned file, then sleeps for five minutes."""
    pids = tmp_path / "compilers"
    cxx = tmp_path / "fake-c++"
    cxx.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        compile=
        for a in "$@"; do [ "$a" = "-c" ] && compile=1; done
        if [ -z "$compile" ]; then echo "g++ (GCC) 13.2.0"; exit 0; fi
        echo $$ >> {pids}
        exec sleep 300
        """))
    cxx.chmod(0o755)
    monkeypatch.setenv("CXX", str(cxx))
    return pids


def running(pid: int) -> bool:
    """Alive and not a zombie waiting for its reaper."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def compilers(pids: Path) -> list[int]:
    return [int(p) for p in pids.read_text().split()] if pids.exists() else []


def wait_for(what, timeout: float) -> None:
    end = time.monotonic() + timeout
    while not what():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.1)


def test_a_cancelled_build_runs_on_until_stop_builds_ends_it(tmp_path, sleeping_compiler):
    with pytest.raises(InterruptedError):  # the cancel comes once a compiler runs
        build.compile_module(tmp_path / "build", None, cancelled=lambda: bool(compilers(sleeping_compiler)),
                             timeout_s=START_S)
    started = compilers(sleeping_compiler)
    time.sleep(0.5)
    assert all(running(p) for p in started)  # left to run: a load that follows would find it
    assert build.stop_builds() == 1
    time.sleep(0.5)
    assert not any(running(p) for p in started)
    assert build.stop_builds() == 0


def compiling_loader(target, draft, device, progress, cancelled, *, folder: str):
    """Runs in the engine process: a load that is all kernel compile, as a first launch's is."""
    build.compile_module(Path(folder), None, progress, cancelled, timeout_s=START_S)
    raise AssertionError("the fake compiler never finishes")


@pytest.mark.parametrize("cancel_first", [False, True], ids=["quit mid-compile", "quit after a cancelled load"])
def test_quitting_the_engine_process_ends_the_compile_it_started(tmp_path, sleeping_compiler, cancel_first):
    proc, conn = spawn(Factory("tests.engine.test_compile_ends_with_engine:compiling_loader",
                               {"folder": str(tmp_path / "build")}), LISTER)
    try:
        assert isinstance(conn.recv(), Started)
        conn.send(Load("x", None, None))
        wait_for(lambda: compilers(sleeping_compiler), START_S)
        started = compilers(sleeping_compiler)
        if cancel_first:  # the load dialog's Cancel: the load ends, the compile runs on
            from engine.api.protocol import CancelLoad

            conn.send(CancelLoad())
            end = time.monotonic() + 30
            while not isinstance(conn.recv(), LoadCancelled):
                assert time.monotonic() < end
            time.sleep(0.5)
            assert all(running(p) for p in started)
        t0 = time.monotonic()
        conn.send(Shutdown())  # what the window sends when it closes
        proc.join(15)
        assert proc.exitcode == 0, "the engine process did not quit by itself"
        print(f"the engine process quit {time.monotonic() - t0:.1f} s after Shutdown, its compile ended")
        wait_for(lambda: not any(running(p) for p in started), 10)
    finally:
        if proc.exitcode is None:
            proc.kill()
        for pid in compilers(sleeping_compiler):  # never leave a sleeper behind a failed test
            try:
                os.kill(pid, 9)
            except OSError:
                pass
