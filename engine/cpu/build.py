"""Compiling the C++ kernels: the build key, a bounded build in a child process, the one-line cause of a failure, and
the record that keeps a failed build from being retried on every start.

The compile runs in a child process (`child`: torch.utils.cpp_extension with ninja) so
that the engine can bound it, cancel it, report its elapsed time every second and read its output for the cause.
A cancelled load stops waiting for its build but leaves it running, so a load that follows finds it done. The
build ends with the process that started it when that one quits (`stop_builds`, from the engine process's exit):
closing the app ends its compile rather than leave a compiler running a minute with no window. The child holds
the build lock too (see buildlock.py), so a build whose starter was killed outright (kill -9, a crash) finishes on
its own and a later start loads it; a build that was killed leaves no lock, and the next start builds again from
scratch.

`write_prebuilt` puts a module and its key side by side (`python -m engine.cpu prebuilt DIR` for the
PyInstaller bundle, setup.py for a binary wheel): a prebuilt module loads only where its key is the key here.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

CSRC = Path(__file__).with_name("csrc")
NAME = "speclens_quant"
SOURCES = ("bindings.cpp", "decoder.cpp", "isa.cpp", "repack.cpp", "kernels_scalar.cpp", "kernels_avx2.cpp",
           "kernels_avxvnni.cpp", "kernels_avx512.cpp")
# -ffp-contract=off: every float operation rounds where the source says (no silent FMA fusion), which the
# bit-exact dequantization and the cross-ISA identical results rely on. No unroll-and-jam: jamming two
# scale blocks into the row loop doubles the live weight registers and spills them (measured 3x slower).
# Tuples, handed to cpp_extension as fresh lists: it appends torch's own flags to the lists it is given, which
# would change the key for the rest of a process that built.
CFLAGS = ("-O3", "-DNDEBUG", "-fopenmp", "-ffp-contract=off", "-fno-math-errno", "-fno-loop-unroll-and-jam",
          "-std=c++17")
LDFLAGS = ("-fopenmp",)
BUILT = "built"  # written into a build folder once its module has loaded: names the module file
MANIFEST = "build.json"  # beside a prebuilt module: its key and what it was built with
LOG = "build.log"  # the child's output, kept in the build folder for the user
FAILED = "failed.json"  # a failed build's record: its cause and what the cause depended on
BUILD_TIMEOUT_S = 15 * 60  # ~1 min on 2 cores; a build still running after this is stuck or starved
SPACE_CHANGE = 256 << 20  # this much more free space than at a disk-full failure: worth another try

Progress = Callable[[str, float], None]
POSIX = os.name == "posix"  # elsewhere the build child neither shares the lock nor leads its own session


class BuildError(Exception):
    """A build that did not produce a module; str() is the cause in one line."""


class BuildInterrupted(BuildError):
    """A build killed from outside: no fault of the sources or the machine's tools, so not remembered."""


def key() -> str:
    """What a module must have been built from to load here: the sources, the flags, torch and Python."""
    import torch

    h = hashlib.sha256()
    for name in sorted(p.name for p in CSRC.iterdir() if p.suffix in (".cpp", ".h")):
        h.update(name.encode() + (CSRC / name).read_bytes())
    h.update(" ".join(CFLAGS + LDFLAGS).encode() + torch.__version__.encode() + sys.version.encode())
    return h.hexdigest()[:16]


def compiler() -> str:
    """The C++ compiler cpp_extension runs (it reads CXX too)."""
    return os.environ.get("CXX", "c++")


# ---- a failed build, remembered ---------------------------------------------------------------------------------
def conditions(folder: Path) -> dict:
    """What a failure's cause may depend on: the compiler and ninja found, and the free space where the build writes
    (the build folder, and the compiler's temporary files)."""
    def tool(name: str) -> list | None:
        path = shutil.which(name, path=_child_path())
        if path is None:
            return None
        st = os.stat(path)
        return [os.path.realpath(path), st.st_size, st.st_mtime_ns]

    free = []
    for where in (folder.parent, Path(tempfile.gettempdir())):
        try:
            free.append(shutil.disk_usage(where).free)
        except OSError:
            free.append(0)
    return {"compiler": tool(compiler()), "ninja": tool("ninja"), "free": free}


def remembered(folder: Path) -> str | None:
    """The cause of an earlier failed build of these sources when nothing it depended on has changed, else None."""
    try:
        record = json.loads((folder / FAILED).read_text())
        cause, then = str(record["cause"]), record["conditions"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    now = conditions(folder)
    if now["compiler"] != then.get("compiler") or now["ninja"] != then.get("ninja"):
        return None
    if record.get("disk_full") and any(a > b + SPACE_CHANGE for a, b in zip(now["free"], then.get("free", []))):
        return None
    return cause


def remember(folder: Path, cause: str, disk_full: bool) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
        record = {"cause": cause, "disk_full": disk_full, "when": time.time(), "conditions": conditions(folder)}
        (folder / FAILED).write_text(json.dumps(record))
    except OSError:  # a full or read-only cache: the next start tries again, which is all we lose
        pass


# ---- the cause, in one line -------------------------------------------------------------------------------------
_CAUSES = (  # (pattern in the build's output, what to say); the first that matches wins
    (re.compile(r"No space left on device|ENOSPC|Disk quota exceeded", re.I), "no space left on device"),
    (re.compile(r"Killed signal terminated program (\S+)"), "the compiler ({0}) was killed, most likely out of memory"),
    (re.compile(r"fatal error: (.+)"), "{0}"),
    (re.compile(r"\berror: (.+)"), "{0}"),
    (re.compile(r"((?:c\+\+|g\+\+|clang\+\+|ninja)\S*: (?:command )?not found)"), "{0}"),
)


def cause_of(output: str, folder: Path) -> tuple[str, bool]:
    """(one line saying why the build failed, whether the disk was full) from the build's output; never the
    compiler's command line."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for pattern, say in _CAUSES:
        for ln in lines:
            m = pattern.search(ln)
            if m:
                if say == "no space left on device":
                    return f"no space left on device while compiling in {folder.parent} ({_free(folder)} free)", True
                return one_line(say.format(*m.groups())), False
    tail = [ln for ln in lines if not ln.startswith("[") and " -c " not in ln and " -o " not in ln]
    return one_line(tail[-1] if tail else "the build failed with no message"), False


def one_line(text: str, limit: int = 200) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _free(folder: Path) -> str:
    try:
        return f"{shutil.disk_usage(folder.parent).free / 1e6:.0f} MB"
    except OSError:
        return "unknown"


# ---- the build --------------------------------------------------------------------------------------------------
@dataclass
class Ticker:
    """Calls progress once a second or so with the step and the seconds it has taken so far."""

    progress: Progress | None
    what: str
    t0: float = 0.0
    last: float = -1.0

    def __post_init__(self) -> None:
        self.t0 = time.monotonic()

    def __call__(self, extra: str = "") -> None:
        now = time.monotonic()
        if self.progress is not None and now - self.last >= 1.0:
            self.last = now
            self.progress(f"{self.what}{extra}: {now - self.t0:.0f} s", -1.0)


def _child_path() -> str:
    """PATH for the build, with this interpreter's scripts folder at its end: the `ninja` that pip installed beside
    torch is found even when the virtual environment was not activated."""
    return os.pathsep.join(p for p in (os.environ.get("PATH", ""), str(Path(sys.executable).parent)) if p)


def preflight() -> str | None:
    """A missing tool, said before starting a build that cannot succeed (else None)."""
    if shutil.which(compiler(), path=_child_path()) is None:
        return f"no C++ compiler ({compiler()}) on PATH"
    if shutil.which("ninja", path=_child_path()) is None:
        return "ninja is not installed (pip install ninja)"
    return None


_started: list[subprocess.Popen] = []  # this process's build children, while they may still run


def stop_builds() -> int:
    """End every build this process started that still runs (a cancelled load's, left to finish), with its
    compilers; for a process about to quit. Returns how many were running."""
    running = [c for c in _started if c.poll() is None]
    for c in running:
        _kill(c, grace_s=1.0)  # the app waits a few seconds for this process to quit before it kills it
    _started.clear()
    return len(running)


def compile_module(folder: Path, lock_fd: int | None, progress: Progress | None = None,
                   cancelled: Callable[[], bool] | None = None, timeout_s: float = BUILD_TIMEOUT_S) -> Path:
    """Build into `folder` (emptied first: what a killed build left there is not trusted) in a child process and
    return the module's path; BuildError with the cause otherwise. The caller holds the build lock; `lock_fd` is
    handed to the child so the lock lasts as long as the build. A cancel stops waiting and leaves the build
    running (it finishes, and the next load finds it), until `stop_builds` at this process's exit."""
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True, exist_ok=True)
    tick = Ticker(progress, "Compiling the CPU kernels (once; about a minute on 2 cores)")
    root = Path(__file__).resolve().parents[2]  # the folder holding the engine package
    with open(folder / LOG, "wb") as log_file:
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, str(folder), str(-1 if lock_fd is None else lock_fd)], cwd=root,
            stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
            env=dict(os.environ, PATH=_child_path()),
            pass_fds=(lock_fd,) if lock_fd is not None and POSIX else (), start_new_session=POSIX)
    _started[:] = [c for c in _started if c.poll() is None] + [child]
    while True:
        try:
            rc = child.wait(timeout=0.25)
            break
        except subprocess.TimeoutExpired:
            pass
        if cancelled is not None and cancelled():
            raise InterruptedError("cancelled")
        if time.monotonic() - tick.t0 > timeout_s:
            _kill(child)
            raise BuildError(f"the build did not finish within {timeout_s:.0f} s (see {folder / LOG})")
        tick()
    output = (folder / LOG).read_text(errors="replace")
    if rc < 0:  # killed (a shutdown, kill -9, the OOM killer): nothing to remember, the next start builds again
        raise BuildInterrupted(f"the build was stopped by signal {-rc} (see {folder / LOG})")
    if rc != 0:
        raise BuildError(cause_of(output, folder)[0])
    built = [ln.split("=", 1)[1] for ln in output.splitlines() if ln.startswith("module=")]
    if not built:
        raise BuildError(f"the build ended without a module (see {folder / LOG})")
    return Path(built[-1])


def _kill(child: subprocess.Popen, grace_s: float = 5.0) -> None:
    """The child and the compilers it started. ninja puts each compile in a process group of its own, so a signal
    to the child's group does not reach them: SIGTERM first (ninja then interrupts its compiles), then SIGKILL to
    whatever is left in the child's session."""
    import signal

    if not POSIX:
        child.kill()
        child.wait(timeout=30)
        return
    try:
        os.killpg(child.pid, signal.SIGTERM)
        child.wait(timeout=grace_s)
    except (OSError, subprocess.TimeoutExpired):
        pass
    for pid in _session(child.pid) + [child.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    child.wait(timeout=30)


def _session(sid: int) -> list[int]:
    """The processes of session `sid` (Linux /proc; elsewhere none are found)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid:
            found.append(int(stat.parent.name))
    return found


CHILD = "import sys; from engine.cpu.build import child; child(sys.argv[1], int(sys.argv[2]))"


def child(folder: str, lock_fd: int) -> None:
    """In the build process: compile with cpp_extension, import the result, record it, print its path. The record
    is written here, not only by the process that started the build: that one may be gone (the app closed), and
    the next start should load this build, not make another."""
    from torch.utils import cpp_extension

    if lock_fd >= 0:  # the lock's file names the process that holds it for the waiting ones' messages: us now
        os.ftruncate(lock_fd, 0)
        os.pwrite(lock_fd, str(os.getpid()).encode(), 0)
    mod = cpp_extension.load(
        name=NAME, sources=[str(CSRC / s) for s in SOURCES], extra_cflags=list(CFLAGS), extra_ldflags=list(LDFLAGS),
        build_directory=folder, verbose=False)
    (Path(folder) / BUILT).write_text(Path(mod.__file__).name)
    print(f"module={mod.__file__}", flush=True)


def write_prebuilt(module: Path, dest: Path) -> Path:
    """Copy a built module into `dest` with its manifest (the key it was built under): what a bundle or a wheel
    ships."""
    import torch

    dest.mkdir(parents=True, exist_ok=True)
    for old in dest.glob(f"{NAME}*"):
        old.unlink()
    shutil.copy2(module, dest / module.name)
    manifest = {"key": key(), "module": module.name, "torch": torch.__version__, "python": sys.version.split()[0]}
    (dest / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")
    return dest / module.name
