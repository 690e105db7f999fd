"""Load the C++ kernels: a prebuilt module shipped with the program, else a build in the cache, else a build now
(JIT, in a child process: engine/cpu/build.py); None, with one logged line and a sentence for the user, where
none of these works.

Every module is keyed by a hash of the sources, flags, torch and Python (`build.key()`) and loads only under its own
key: a prebuilt one beside this file (`prebuilt/`, with `build.json`: a binary wheel or the PyInstaller bundle),
or `<cache>/ext/<key>/` (later processes import it straight from there, ~1 ms). A fresh build removes the cache's
builds that no process has loaded for two weeks (`prune`). A build is guarded by a lock its owner cannot leave
behind (buildlock.py), bounded in time, and a failed one is remembered (`build.remembered`) so that a start does not
retry a build that cannot succeed until what it failed on changes or `SPECLENS_REBUILD_KERNELS=1` asks.
No -march flag: the instruction set is picked at run time, the best this CPU runs of csrc/isa.cpp's table (the
module's `isa_table()`), so a build made on one machine runs on any x86-64. `SPECLENS_QUANT_EXT=0` disables the
extension (the pure-torch fallback runs instead); `SPECLENS_QUANT_ISA=<name from that table>` pins the
instruction set; `SPECLENS_QUANT_PREBUILT=0` ignores a prebuilt module (tests of the build itself). Once loaded,
the module's tile choice is set for this machine (tune.py).
"""
from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from engine.paths import cache_root
from engine.cpu import build, tune
from engine.cpu.buildlock import BuildLock, LockTimeout

log = logging.getLogger(__name__)

PREBUILT = Path(__file__).with_name("prebuilt")
BUILT = build.BUILT
# Every change to the sources (an update) makes a new build folder. A fresh build removes the others that no
# process has loaded for this long: another install sharing the cache (a second venv, another torch) keeps its
# own as long as it is used, since loading a build touches its record.
STALE_S = 14 * 24 * 3600
SLOWER = "about 11\u00d7 slower"  # the embedded target, kernels against the fallback: 5.92 against 0.54 tok/s

Progress = Callable[[str, float], None]


@dataclass(frozen=True)
class Outcome:
    """Where this process's kernels came from: "prebuilt", "cache", "compiled", or, with none, "disabled" or
    "failed" (detail: the cause in one line)."""

    source: str
    detail: str = ""
    seconds: float | None = None  # the compile's wall time, when this process compiled
    remembered: bool = False  # the failure is an earlier build's, not retried


_module: ModuleType | None = None
_outcome: Outcome | None = None
_guard = threading.Lock()
_said: dict[str, str] = {}  # what was logged once already


def build_dir() -> Path:
    return cache_root() / "ext" / build.key()


def load(progress: Progress | None = None, cancelled: Callable[[], bool] | None = None) -> ModuleType | None:
    """The compiled module, or None (logged once) when disabled or when no module can be had. Decided once per
    process; `progress(stage, -1)` hears about a wait or a compile every second. A cancel raises InterruptedError
    and decides nothing (a build already started runs on, and a later load finds it)."""
    global _module, _outcome
    with _guard:
        if _outcome is None:
            _module, _outcome = _decide(progress, cancelled)
            _report(_outcome)
            isa = os.environ.get("SPECLENS_QUANT_ISA")
            if isa and _module is not None:
                _module.set_isa(isa)
            if _module is not None:
                _tune(_module)
        return _module


def _tune(mod: ModuleType) -> None:
    """This machine's choice of tile (engine/cpu/tune.py); the defaults stand if that fails."""
    try:
        tune.apply(mod, build.key(), cache_root() / "kernel-tuning.json")
    except Exception:  # noqa: BLE001 - a choice of speed only: never a reason not to run
        log.warning("timing the kernel tiles failed; keeping the defaults", exc_info=True)


def find() -> ModuleType | None:
    """load() when a module is ready to import (prebuilt or built), else None with nothing decided: never compiles.
    The engine's warm-up calls this, so that a compile happens in the load, where its progress is shown."""
    with _guard:
        if _outcome is not None:
            return _module
    if os.environ.get("SPECLENS_QUANT_EXT", "1") == "0" or _prebuilt(build.key()) is not None \
            or _built(build_dir()) is not None:
        return load()
    return None


def outcome() -> Outcome | None:
    """How load() decided (None before it did)."""
    return _outcome


def forget() -> None:
    """Decide again at the next load() (tests)."""
    global _module, _outcome
    with _guard:
        _module, _outcome = None, None


def _decide(progress: Progress | None, cancelled: Callable[[], bool] | None) -> tuple[ModuleType | None, Outcome]:
    if os.environ.get("SPECLENS_QUANT_EXT", "1") == "0":
        return None, Outcome("disabled", "SPECLENS_QUANT_EXT=0")
    try:
        key = build.key()
        mod = _prebuilt(key)
        if mod is not None:
            return mod, Outcome("prebuilt")
        folder = cache_root() / "ext" / key
        mod = _built(folder)
        if mod is not None:
            return mod, Outcome("cache")
        if getattr(sys, "frozen", False):  # a bundle has no compiler headers: it must ship its module
            return None, Outcome("failed", f"this bundle ships no kernels built for it ({PREBUILT})")
        return _build(folder, progress, cancelled)
    except InterruptedError:
        raise
    except Exception as e:  # noqa: BLE001 - an unreadable cache or a broken torch also mean "run the fallback"
        log.debug("loading the kernels failed", exc_info=True)
        return None, Outcome("failed", build.one_line(f"{type(e).__name__}: {e}"))


def _build(folder: Path, progress: Progress | None,
           cancelled: Callable[[], bool] | None) -> tuple[ModuleType | None, Outcome]:
    """Compile under the build lock, unless an earlier failure under the same conditions is remembered."""
    asked = os.environ.get("SPECLENS_REBUILD_KERNELS") == "1"
    cause = None if asked else build.remembered(folder)
    if cause is not None:
        return None, Outcome("failed", cause, remembered=True)
    missing = build.preflight()
    if missing is not None:
        build.remember(folder, missing, disk_full=False)
        return None, Outcome("failed", missing)
    lock = BuildLock(folder.with_name(folder.name + ".lock"))
    tick = build.Ticker(progress, "Waiting for another SpecLens process to finish compiling the CPU kernels")
    try:
        lock.acquire(build.BUILD_TIMEOUT_S, lambda _s, pid: tick(f" (pid {pid})" if pid else ""), cancelled)
    except LockTimeout as e:
        return None, Outcome("failed", str(e))
    try:
        mod = _built(folder)  # another process built it while we waited
        if mod is not None:
            return mod, Outcome("cache")
        cause = None if asked else build.remembered(folder)  # ... or failed to, under the same conditions
        if cause is not None:
            return None, Outcome("failed", cause, remembered=True)
        t0 = time.perf_counter()
        try:
            path = build.compile_module(folder, lock.fd, progress, cancelled)
            mod = _import(path)
        except build.BuildError as e:
            if not isinstance(e, build.BuildInterrupted):
                build.remember(folder, str(e), disk_full=str(e).startswith("no space left"))
            return None, Outcome("failed", str(e))
        (folder / BUILT).write_text(path.name)  # only after the module has loaded here
        prune(folder)
        return mod, Outcome("compiled", seconds=time.perf_counter() - t0)
    finally:
        lock.release()


def _report(o: Outcome) -> None:
    if o.source == "compiled":
        log.info("built the quantized kernels in %.1f s", o.seconds)
    elif o.source == "prebuilt":
        log.info("using the prebuilt quantized kernels (%s)", PREBUILT)
    elif o.source in ("disabled", "failed"):
        again = (" (an earlier build's failure, not retried: it is when the compiler or the free space changes, "
                 "or with SPECLENS_REBUILD_KERNELS=1)" if o.remembered else "")
        log.warning("no quantized kernels: %s%s. %s", o.detail, again, notice())


def notice() -> str:
    """One sentence for the user when the kernels are missing, short enough for a status line: what, the cost, the
    remedy. "" when they loaded. The cause in full is in the log (`_report`)."""
    o = _outcome
    if o is None or o.source not in ("disabled", "failed"):
        return ""
    cost = f"so replies run {SLOWER}"
    if o.source == "disabled":
        return f"CPU kernels turned off (SPECLENS_QUANT_EXT=0), {cost}: unset it and restart."
    if getattr(sys, "frozen", False):
        return (f"This bundle's CPU kernels did not load, {cost}: that should not happen, please report it with "
                "what speclens prints in a terminal.")
    if o.detail.startswith("no C++ compiler"):
        why, remedy = "no C++ compiler found", "install g++ and restart"
    elif o.detail.startswith("no space left"):
        why, remedy = "the disk was full", "free some disk space and restart"
    else:
        why, remedy = "their build failed", f"see {build_dir() / build.LOG}"
    return f"No compiled CPU kernels ({why}), {cost}: {remedy}."


def describe() -> str:
    """Which kernels run, for logs and the benchmark: "AVX2 kernels (prebuilt)", "pure-torch fallback (...)"."""
    mod = load()
    o = _outcome
    if mod is None:
        return f"pure-torch fallback ({o.detail if o else 'not loaded'})"
    return f"{dict(mod.isa_table())[mod.isa()]} kernels ({o.source if o else '?'})"


def _import(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(build.NAME, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _prebuilt(key: str) -> ModuleType | None:
    """The module shipped beside this file, when it was built under this very key."""
    if os.environ.get("SPECLENS_QUANT_PREBUILT", "1") == "0":
        return None
    try:
        manifest = json.loads((PREBUILT / build.MANIFEST).read_text())
    except (OSError, ValueError):
        return None  # a source install: nothing shipped
    if manifest.get("key") != key:
        if _said.get("prebuilt") == manifest.get("key"):
            return None  # said once (find() and load() both look)
        _said["prebuilt"] = manifest.get("key")
        log.warning("the prebuilt kernels were built for other sources or another torch/python (%s, torch %s, "
                 "python %s); building them here", manifest.get("key"), manifest.get("torch"), manifest.get("python"))
        return None
    try:
        return _import(PREBUILT / manifest["module"])
    except Exception:  # noqa: BLE001 - a damaged file: the cache or a build can still help
        log.warning("the prebuilt kernels in %s do not load; trying a build instead", PREBUILT, exc_info=True)
        return None


def _built(folder: Path) -> ModuleType | None:
    """The module a finished build left in `folder` (its hash covers sources, flags, torch and python), else None:
    no build yet, or one that does not load (then it is built again)."""
    try:
        mod = _import(folder / (folder / BUILT).read_text().strip())
    except Exception:  # noqa: BLE001 - anything wrong with a previous build means "build it"
        log.debug("no usable build in %s", folder, exc_info=True)
        return None
    try:
        os.utime(folder / BUILT)  # in use: `prune` leaves it alone
    except OSError:  # a read-only cache still runs
        pass
    return mod


def prune(current: Path, stale_s: float = STALE_S) -> list[Path]:
    """Remove the build folders beside `current` whose record (or, unfinished, the folder itself) is older than
    stale_s, with their lock files; returns what was removed. Best effort: a folder that cannot be removed stays."""
    removed = []
    now = time.time()
    for other in current.parent.iterdir():
        if other == current or not other.is_dir():
            continue
        record = other / BUILT
        try:
            age = now - (record if record.exists() else other).stat().st_mtime
        except OSError:
            continue
        if age > stale_s:
            shutil.rmtree(other, ignore_errors=True)
            if not other.exists():
                removed.append(other)
                other.with_name(other.name + ".lock").unlink(missing_ok=True)
    if removed:
        log.info("removed %d old kernel build(s) from %s", len(removed), current.parent)
    return removed
