"""Build (once, JIT) and load the C++ kernels; None, with one logged line, where they cannot be built.

The extension is compiled by `torch.utils.cpp_extension.load` with ninja and the system's C++ compiler on
first use, into `<cache>/ext/<hash of sources, flags, torch and python>`; later processes import the built
module straight from there (~1 ms, where asking cpp_extension and ninja again takes ~0.15 s).
A fresh build removes the builds beside it that no process has loaded for two weeks (`prune`).
No -march flag: the instruction set is picked at run time, the best this CPU runs of csrc/isa.cpp's table (the
module's `isa_table()`), so a build made on one machine runs on any x86-64. `SPECLENS_QUANT_EXT=0` disables the
extension (the pure-torch fallback runs instead); `SPECLENS_QUANT_ISA=<name from that table>` pins the
instruction set.
"""
from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import shutil
import sys
import time
from pathlib import Path
from types import ModuleType

import torch

from engine.paths import cache_root

log = logging.getLogger(__name__)

CSRC = Path(__file__).with_name("csrc")
SOURCES = ("bindings.cpp", "decoder.cpp", "isa.cpp", "repack.cpp", "kernels_scalar.cpp", "kernels_avx2.cpp",
           "kernels_avxvnni.cpp", "kernels_avx512.cpp")
# -ffp-contract=off: every float operation rounds where the source says (no silent FMA fusion), which the
# bit-exact dequantization and the cross-ISA identical results rely on. No unroll-and-jam: jamming two
# scale blocks into the row loop doubles the live weight registers and spills them (measured 3x slower).
# Tuples, handed to cpp_extension as fresh lists: it appends torch's own flags to the lists it is given, which
# would change build_dir() for the rest of a process that built.
CFLAGS = ("-O3", "-DNDEBUG", "-fopenmp", "-ffp-contract=off", "-fno-math-errno", "-fno-loop-unroll-and-jam", "-std=c++17")
LDFLAGS = ("-fopenmp",)

build_seconds: float | None = None  # set when this process compiled the extension (not when it loaded a build)
BUILT = "built"  # written into the build folder once a build has loaded: names the module file
# Every change to the sources (an update) makes a new build folder. A fresh build removes the others that no
# process has loaded for this long: another install sharing the cache (a second venv, another torch) keeps its
# own as long as it is used, since loading a build touches its record.
STALE_S = 14 * 24 * 3600


def build_dir() -> Path:
    h = hashlib.sha256()
    for name in sorted(p.name for p in CSRC.iterdir() if p.suffix in (".cpp", ".h")):
        h.update(name.encode() + (CSRC / name).read_bytes())
    h.update(" ".join(CFLAGS + LDFLAGS).encode() + torch.__version__.encode() + sys.version.encode())
    return cache_root() / "ext" / h.hexdigest()[:16]


@functools.cache
def load() -> ModuleType | None:
    """The compiled module, or None (logged once) when disabled or when the build fails."""
    global build_seconds
    if os.environ.get("SPECLENS_QUANT_EXT", "1") == "0":
        log.warning("quantized kernels disabled by SPECLENS_QUANT_EXT=0; using the pure-torch fallback")
        return None
    try:
        folder = build_dir()
        mod = _built(folder)
        if mod is None:
            from torch.utils import cpp_extension

            folder.mkdir(parents=True, exist_ok=True)
            fresh = not any(folder.glob("*.so"))
            t0 = time.perf_counter()
            mod = cpp_extension.load(
                name="speclens_quant", sources=[str(CSRC / s) for s in SOURCES], extra_cflags=list(CFLAGS),
                extra_ldflags=list(LDFLAGS), build_directory=str(folder), verbose=False,
            )
            if fresh:
                build_seconds = time.perf_counter() - t0
                log.info("built the quantized kernels in %.1f s (%s)", build_seconds, folder)
            (folder / BUILT).write_text(Path(mod.__file__).name)  # only after the module has loaded
            prune(folder)
        isa = os.environ.get("SPECLENS_QUANT_ISA")
        if isa:
            mod.set_isa(isa)
        return mod
    except Exception as e:  # no compiler, no ninja, a failed build: all mean "run the fallback"
        first = next((ln for ln in str(e).splitlines() if ln.strip()), type(e).__name__)
        log.warning("quantized kernels could not be built (%s); using the slow pure-torch fallback", first[:200])
        log.debug("extension build failure", exc_info=True)
        return None


def _built(folder: Path) -> ModuleType | None:
    """The module a finished build left in `folder` (its hash covers sources, flags, torch and python), else None:
    no build yet, or one that does not load (then cpp_extension builds it again)."""
    try:
        path = folder / (folder / BUILT).read_text().strip()
        spec = importlib.util.spec_from_file_location("speclens_quant", path)
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
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
    stale_s; returns what was removed. Best effort: a folder that cannot be removed stays."""
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
    if removed:
        log.info("removed %d old kernel build(s) from %s", len(removed), current.parent)
    return removed
