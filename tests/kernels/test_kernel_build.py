"""The kernel build (engine/cpu/ext.py, build.py, buildlock.py): a build killed at any point never blocks a later
start, every wait is bounded, a failure is said in one line and remembered, and prebuilt modules load under their
key only.

Two tests really compile (about a minute each on 2 cores): that is what they are about. They run the build in
child processes with an empty SPECLENS_CACHE of their own and never touch the kernels this process loaded.
"""
from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from engine.cpu import build, ext
from engine.cpu.buildlock import BuildLock, LockTimeout

ROOT = Path(__file__).resolve().parents[2]
COMPILE_S = 600  # a generous bound on one real build; a hang fails the test instead of stalling the suite


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """ext deciding again, over an empty cache and ignoring any prebuilt module; this process's own decision is
    put back afterwards, so the kernel tests that follow keep the module they loaded."""
    saved = ext._module, ext._outcome
    monkeypatch.setenv("SPECLENS_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SPECLENS_QUANT_PREBUILT", "0")
    monkeypatch.delenv("SPECLENS_REBUILD_KERNELS", raising=False)
    monkeypatch.delenv("SPECLENS_QUANT_EXT", raising=False)
    ext.forget()
    yield tmp_path
    ext._module, ext._outcome = saved


def fake_compiler(folder: Path, message: str) -> Path:
    """A `c++` that counts its calls and fails with `message`, as g++ does on a full disk."""
    cxx = folder / "fake-c++"
    calls = folder / "calls"
    cxx.write_text(textwrap.dedent(f"""\
        #!/bin/sh
        compile=
        for a in "$@"; do [ "$a" = "-c" ] && compile=1; done
        if [ -z "$compile" ]; then echo "g++ (GCC) 13.2.0"; exit 0; fi  # torch's version checks
        echo x >> {calls}
        echo "{message}" >&2
        exit 1
        """))
    cxx.chmod(0o755)
    return cxx


def calls(folder: Path) -> int:
    f = folder / "calls"
    return len(f.read_text().split()) if f.exists() else 0


DISK_FULL = "bindings.cpp:1: fatal error: error writing to /tmp/ccA1.s: No space left on device"


def test_a_failed_build_says_its_cause_in_one_line_and_is_remembered(fresh, monkeypatch, caplog):
    monkeypatch.setenv("CXX", str(fake_compiler(fresh, DISK_FULL)))
    with caplog.at_level(logging.WARNING, logger="engine.cpu.ext"):
        assert ext.load() is None
    warned = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warned) == 1 and "\n" not in warned[0], warned
    assert "no space left on device while compiling in" in warned[0] and "-MMD" not in warned[0], warned[0]
    assert "11\u00d7 slower" in warned[0] and "free some disk space" in warned[0]
    assert ext.notice() == "No compiled CPU kernels (the disk was full), so replies run about 11\u00d7 slower: " \
        "free some disk space and restart."
    first = calls(fresh)
    assert first >= 1

    ext.forget()  # the next start, same sources, same compiler, same free space: not tried again
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="engine.cpu.ext"):
        assert ext.load() is None and calls(fresh) == first
    assert ext.outcome().remembered and "no space left on device" in ext.outcome().detail
    assert "SPECLENS_REBUILD_KERNELS=1" in caplog.text  # how to ask, in the log line

    ext.forget()  # the user asks
    monkeypatch.setenv("SPECLENS_REBUILD_KERNELS", "1")
    assert ext.load() is None and calls(fresh) > first


def test_a_remembered_failure_is_retried_when_its_cause_changes(fresh, monkeypatch):
    cxx = fake_compiler(fresh, DISK_FULL)
    monkeypatch.setenv("CXX", str(cxx))
    assert ext.load() is None
    n = calls(fresh)
    record = ext.build_dir() / build.FAILED

    ext.forget()  # space was freed since (the record says there was 1 GB less then)
    data = json.loads(record.read_text())
    data["conditions"]["free"] = [f - (1 << 30) for f in data["conditions"]["free"]]
    record.write_text(json.dumps(data))
    assert ext.load() is None and calls(fresh) > n
    n = calls(fresh)

    ext.forget()  # another compiler (an update, a new install)
    cxx.write_text(cxx.read_text().replace("No space left on device", "internal compiler error"))
    assert ext.load() is None and calls(fresh) > n
    assert ext.outcome().detail.startswith("error writing to") and not ext.outcome().remembered


def test_a_build_killed_from_outside_is_not_remembered(fresh, monkeypatch):
    """kill -9 of the build (a shutdown, the OOM killer) is no cause to give up on these sources: the next start
    builds again. (Found by the app-level check: a killed build was remembered as "failed with no message".)"""
    cxx = fake_compiler(fresh, "unused")
    session_leader = "$(cut -d' ' -f6 /proc/$$/stat)"  # the build child: it leads its session
    cxx.write_text(cxx.read_text().replace('echo "unused" >&2', f"kill -9 {session_leader}; sleep 1"))
    monkeypatch.setenv("CXX", str(cxx))
    assert ext.load() is None and ext.outcome().detail.startswith("the build was stopped by signal 9")
    assert not (ext.build_dir() / build.FAILED).exists()
    n = calls(fresh)
    ext.forget()
    assert ext.load() is None and calls(fresh) > n


def test_no_compiler_is_said_without_trying(fresh, monkeypatch):
    monkeypatch.setenv("CXX", "no-such-c++")
    assert ext.load() is None
    assert ext.outcome().detail == "no C++ compiler (no-such-c++) on PATH"
    assert ext.notice() == "No compiled CPU kernels (no C++ compiler found), so replies run about 11\u00d7 slower: " \
        "install g++ and restart."
    assert not any(ext.build_dir().glob("*.o"))


def test_a_lock_whose_owner_is_gone_does_not_block(fresh, monkeypatch):
    """A lock file left by a dead process (ours and torch's): the build starts at once."""
    monkeypatch.setenv("CXX", str(fake_compiler(fresh, "error: stop here")))
    folder = ext.build_dir()
    folder.mkdir(parents=True)
    (folder / "lock").write_text("")  # torch's baton, as a killed cpp_extension build leaves it
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    folder.with_name(folder.name + ".lock").write_text(str(dead.pid))
    t0 = time.monotonic()
    assert ext.load() is None
    assert calls(fresh) >= 1 and time.monotonic() - t0 < 60  # it compiled (and failed, as this compiler does)
    assert ext.outcome().detail == "stop here"


def test_a_lock_held_by_a_live_process_is_waited_for_with_a_bound(tmp_path):
    path = tmp_path / "k.lock"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from pathlib import Path; from engine.cpu.buildlock import BuildLock
        lock = BuildLock(Path({str(path)!r})); assert lock.try_acquire(); print("held", flush=True); time.sleep(120)
        """)], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert holder.stdout.readline().strip() == "held"
        seen = []
        t0 = time.monotonic()
        with pytest.raises(LockTimeout, match=f"pid {holder.pid}"):
            BuildLock(path).acquire(1.0, lambda s, pid: seen.append(pid))
        assert time.monotonic() - t0 < 5 and seen and seen[-1] == holder.pid
        holder.kill()  # kill -9: the operating system drops the lock with its owner
        holder.wait()
        lock = BuildLock(path)
        lock.acquire(5.0)
        lock.release()
    finally:
        holder.kill()


def test_a_build_that_hangs_is_stopped_at_its_bound(fresh, monkeypatch):
    """A compiler that never returns (a hung NFS mount, a starved machine): the build is killed, with its
    compilers, at the bound, and the load goes on without kernels."""
    cxx = fake_compiler(fresh, "never")
    pids = fresh / "sleepers"
    cxx.write_text(cxx.read_text().replace('echo "never" >&2', f"echo $$ >> {pids}; exec sleep 300"))
    monkeypatch.setenv("CXX", str(cxx))
    started: list[float] = []

    def compiler_started() -> bool:
        """Asked every 0.25 s before the bound is: it holds the build's wait until the compiler runs (the child
        first imports torch, which on a busy machine can take longer than the bound), so the bound always falls
        while a compiler runs, the case under test. Never a cancel."""
        deadline = time.monotonic() + 120
        while not pids.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        if not started:
            started.append(time.monotonic())
        return False

    t0 = time.monotonic()
    with pytest.raises(build.BuildError, match="did not finish within 3 s"):
        build.compile_module(fresh / "build", None, cancelled=compiler_started, timeout_s=3)
    assert pids.exists(), "the fake compiler never ran"
    assert time.monotonic() - max(t0 + 3, started[0]) < 30  # stopped within the kill's grace of the bound
    sleepers = [int(p) for p in pids.read_text().split()]
    assert sleepers
    time.sleep(0.5)
    for pid in sleepers:  # gone, or a zombie waiting for its (killed) parent's reaper
        stat = Path(f"/proc/{pid}/stat")
        assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z", f"compiler {pid} runs on"


# ---- real builds, killed ----------------------------------------------------------------------------------------
def start(cache: Path) -> subprocess.Popen:
    """A process that loads the kernels as the engine does, printing each progress stage."""
    code = ("from engine.cpu import ext; m = ext.load(lambda s, f: print('STAGE', s, flush=True)); "
            "print('RESULT', ext.outcome().source, m is not None, flush=True)")
    env = dict(os.environ, SPECLENS_CACHE=str(cache), SPECLENS_QUANT_PREBUILT="0")
    return subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True)


def compiling(proc: subprocess.Popen, cache: Path) -> int:
    """Once the compiler runs: the pid of the build child (it leads its own session)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        assert line, "the loading process ended before compiling"
        if line.startswith("STAGE Compiling the CPU kernels"):
            running = [pid for pid in build_children(cache) if compiler_running(pid)]
            if running:
                return running[0]
    raise AssertionError("no compiler ran within 120 s")


def ext_folder(cache: Path) -> Path:
    return next((p for p in (cache / "ext").iterdir() if p.is_dir()), cache / "ext")


def build_children(cache: Path) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if proc.name.isdigit() and str(ext_folder(cache)).encode() in cmd and b"-c" in cmd:
            found.append(int(proc.name))
    return found


def compiler_running(session: int) -> bool:
    """A compiler process in the build child's session (so killing now interrupts real work)."""
    for proc in Path("/proc").iterdir():
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[3]) == session and ("cc1plus" in stat or "(c++)" in stat or "(g++)" in stat):
            return True
    return False


def finish(proc: subprocess.Popen) -> tuple[list[str], str]:
    out, _ = proc.communicate(timeout=COMPILE_S)
    lines = out.splitlines()
    return [ln[6:] for ln in lines if ln.startswith("STAGE ")], next(ln for ln in lines if ln.startswith("RESULT"))


def test_a_build_killed_mid_compile_is_built_again_at_the_next_start(tmp_path):
    """kill -9 of the loading process and of the compile it started (all of it, as at a power loss): the next
    start finds torch's lock file and half the objects, and builds and loads the kernels. Before, it waited on
    that lock forever."""
    cache = tmp_path / "cache"
    first = start(cache)
    child = compiling(first, cache)
    for pid in build._session(child):  # the build child, ninja and the compilers (ninja gives each its own group)
        os.kill(pid, signal.SIGKILL)
    first.kill()
    first.wait()
    folder = ext_folder(cache)
    assert (folder / "lock").exists() and not (folder / ext.BUILT).exists()  # what the old code waited on
    stages, result = finish(start(cache))
    assert result == "RESULT compiled True", (stages, result)
    seconds = [int(s.rsplit(": ", 1)[1].split()[0]) for s in stages if s.startswith("Compiling the CPU kernels")]
    assert len(set(seconds)) > 3 and seconds == sorted(seconds)  # the elapsed time moves, second by second


def test_a_build_whose_app_was_killed_finishes_and_the_next_start_loads_it(tmp_path):
    """kill -9 of the loading process only (the app closed): its build runs on, holding the lock, and the next
    start waits for it, saying so, then loads what it built without compiling again."""
    cache = tmp_path / "cache"
    first = start(cache)
    child = compiling(first, cache)
    first.kill()
    first.wait()
    stages, result = finish(start(cache))
    assert result == "RESULT cache True", (stages, result)
    waits = [s for s in stages if s.startswith("Waiting for another SpecLens process to finish compiling")]
    assert waits and f"(pid {child}):" in waits[-1], stages  # it names the build that runs on


# ---- prebuilt modules -------------------------------------------------------------------------------------------
def run_with_prebuilt(prebuilt: Path, cache: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    code = (f"from pathlib import Path; from engine.cpu import ext; ext.PREBUILT = Path({str(prebuilt)!r}); "
            "m = ext.load(); print(ext.outcome().source, m is not None)")
    env = dict(os.environ, SPECLENS_CACHE=str(cache), PATH="", CXX="no-such-c++", **(env or {}))
    env.pop("SPECLENS_QUANT_PREBUILT", None)
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


@pytest.fixture
def shipped(tmp_path):
    """This machine's module, written as a bundle or a wheel ships it."""
    mod = ext.load()
    if mod is None:
        pytest.skip("the kernels did not build here; their build is tested above")
    build.write_prebuilt(Path(mod.__file__), tmp_path / "prebuilt")
    return tmp_path / "prebuilt"


def test_a_prebuilt_module_loads_with_no_compiler_and_an_empty_cache(shipped, tmp_path):
    out = run_with_prebuilt(shipped, tmp_path / "empty")
    assert out.stdout.split() == ["prebuilt", "True"], out.stdout + out.stderr
    assert not (tmp_path / "empty" / "ext").exists()  # nothing built, nothing cached


def test_a_prebuilt_module_of_other_sources_is_not_loaded(shipped, tmp_path):
    manifest = json.loads((shipped / build.MANIFEST).read_text())
    (shipped / build.MANIFEST).write_text(json.dumps(dict(manifest, key="0123456789abcdef", torch="2.0.0")))
    out = run_with_prebuilt(shipped, tmp_path / "empty")
    assert out.stdout.split() == ["failed", "False"], out.stdout + out.stderr  # no compiler here: the fallback
    assert "built for other sources or another torch/python" in out.stderr


def test_disabled_by_environment(fresh, monkeypatch, caplog):
    monkeypatch.setenv("SPECLENS_QUANT_EXT", "0")
    with caplog.at_level(logging.WARNING, logger="engine.cpu.ext"):
        assert ext.load() is None
    assert "SPECLENS_QUANT_EXT=0" in caplog.text and ext.outcome().source == "disabled"


# ---- the build record and the cache's old builds (moved from tests/kernels/test_kernels.py) ---------------------------
def test_a_finished_build_is_imported_without_asking_cpp_extension(kernels):
    """Later processes import the module the build left (~1 ms) instead of running cpp_extension and ninja."""
    code = ("import sys, engine.cpu.ext as e; m = e.load(); "
            "assert m is not None and m.isa(); assert 'torch.utils.cpp_extension' not in sys.modules")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


def test_an_unusable_build_record_means_building_again(tmp_path):
    assert ext._built(tmp_path) is None  # no record
    (tmp_path / ext.BUILT).write_text("speclens_quant.so")
    (tmp_path / "speclens_quant.so").write_bytes(b"not a shared object")  # e.g. a copy cut short
    assert ext._built(tmp_path) is None


def test_a_fresh_build_removes_builds_unused_for_two_weeks(tmp_path):
    """Each update of the sources makes a new build folder: the old ones must not pile up, but a build that
    another install still loads (its record touched on every load) stays."""
    current, old, in_use, unfinished, half_built = (tmp_path / n for n in ("now", "old", "used", "stale", "fresh"))
    for folder in (current, old, in_use, unfinished, half_built):
        folder.mkdir()
    for folder in (old, in_use):
        (folder / ext.BUILT).write_text("speclens_quant.so")
    (tmp_path / "old.lock").write_text("1")
    month_ago = time.time() - 30 * 24 * 3600
    os.utime(old / ext.BUILT, (month_ago, month_ago))
    os.utime(unfinished, (month_ago, month_ago))  # a build that never finished, long ago
    os.utime(in_use, (month_ago, month_ago))  # the folder is old, its record was touched today
    assert sorted(ext.prune(current)) == sorted([old, unfinished])
    assert current.is_dir() and in_use.is_dir() and half_built.is_dir() and not old.exists()
    assert not (tmp_path / "old.lock").exists()


def test_loading_a_build_marks_it_in_use(kernels):
    folder = ext.build_dir()
    if not (folder / ext.BUILT).exists():
        pytest.skip("this process's kernels are a prebuilt module, not a cache build")
    os.utime(folder / ext.BUILT, (0, 0))
    assert ext._built(folder) is not None
    assert (folder / ext.BUILT).stat().st_mtime > 1e9


@pytest.mark.parametrize("output, cause", [
    ("[1/8] c++ -MMD -MF x.o.d -O3 -c bindings.cpp -o bindings.o\nFAILED: bindings.o\n"
     "c++: fatal error: Killed signal terminated program cc1plus\n",
     "the compiler (cc1plus) was killed, most likely out of memory"),
    ("FAILED: decoder.o\nc++ -MMD -c decoder.cpp -o decoder.o\ndecoder.cpp:3:10: fatal error: torch/extension.h: "
     "No such file or directory\n", "torch/extension.h: No such file or directory"),
    ("/bin/sh: 1: c++: not found\nninja: build stopped: subcommand failed.\n", "c++: not found"),
])
def test_the_cause_is_a_line_of_the_output_never_the_command(output, cause, tmp_path):
    assert build.cause_of(output, tmp_path / "x") == (cause, False)
