"""Where other apps keep GGUF models on this machine: LM Studio, Ollama and llama.cpp's own downloads.

Only the locations and their layouts live here; engine.io.hub describes what is found. Nothing is written, and a
broken entry (an unreadable manifest, a missing blob, a symlink loop) is skipped with a log line, never fatal.
Walks are bounded (depth and entries) so a huge or looping folder cannot stall a listing.
"""
from __future__ import annotations

import json
import logging
import os
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

MAX_DEPTH = 6  # LM Studio: models/<publisher>/<repo>/<file>; llama.cpp's HF-style layout: 4 below its cache
MAX_ENTRIES = 5000  # folder entries looked at per root
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
OLLAMA_REGISTRY = "registry.ollama.ai"
# Set to "off" to list neither (the tests do, so a developer's own models never enter them)
ENV_SWITCH = "SPECLENS_OTHER_APPS"
# Where a model was found, as the user knows the place (LocalModel.source -> words)
SOURCE_NAMES = {"embedded": "embedded", "hf-cache": "Hugging Face cache", "gguf": "Hugging Face cache",
                "lm-studio": "LM Studio", "ollama": "Ollama", "llama.cpp": "llama.cpp"}


def size_text(params_b: float | None) -> str:
    """A parameter count in billions as a model card writes it: "1.50B", "0.27B"; a stub's few thousand weights
    "2.1K", not "0.00B"; "?" when unknown."""
    p = params_b or 0.0
    if p <= 0:
        return "?"
    return f"{p:.2f}B" if p >= 0.01 else f"{p * 1e3:.2g}M" if p >= 1e-3 else f"{p * 1e6:.2g}K"
_SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")  # llama.cpp's split files: name-00001-of-00003.gguf
_DIGEST = re.compile(r"sha256[:-]([0-9a-f]{64})")


@dataclass(frozen=True)
class Found:
    path: Path  # the GGUF (an Ollama blob has no .gguf suffix)
    source: str  # "lm-studio", "ollama", "llama.cpp"
    name: str  # publisher/repo/file for LM Studio, name:tag for Ollama, the file's name for llama.cpp
    parts: int = 1  # the first of a split GGUF: how many files it is split into


def enabled() -> bool:
    return os.environ.get(ENV_SWITCH, "").lower() not in ("off", "0", "no", "false")


def _home() -> Path:
    return Path(os.environ.get("HOME") or Path.home()).expanduser()


def lmstudio_dirs() -> list[Path]:
    """LM Studio's models folder, current (~/.lmstudio/models) then older (~/.cache/lm-studio/models)."""
    return [_home() / ".lmstudio" / "models", _home() / ".cache" / "lm-studio" / "models"]


def ollama_dir() -> Path:
    """Ollama's models folder (manifests/ and blobs/): OLLAMA_MODELS, else ~/.ollama/models."""
    env = os.environ.get("OLLAMA_MODELS")
    return Path(env).expanduser() if env else _home() / ".ollama" / "models"


def llamacpp_dir() -> Path:
    """Where llama.cpp's -hf downloads go: LLAMA_CACHE, else the user cache folder's llama.cpp."""
    if env := os.environ.get("LLAMA_CACHE"):
        return Path(env).expanduser()
    if sys.platform == "darwin":
        return _home() / "Library" / "Caches" / "llama.cpp"
    return Path(os.environ.get("XDG_CACHE_HOME") or _home() / ".cache").expanduser() / "llama.cpp"


def walk_ggufs(root: Path, max_depth: int = MAX_DEPTH, max_entries: int = MAX_ENTRIES) -> Iterator[Path]:
    """The .gguf files under root, sorted within each folder; symlinked folders followed once (a loop is logged
    and cut), the walk bounded in depth and entries."""
    seen: set[tuple[int, int]] = set()
    budget = [max_entries]

    def visit(folder: Path, depth: int) -> Iterator[Path]:
        try:
            st = folder.stat()
            if (st.st_dev, st.st_ino) in seen:
                log.warning("skipping %s: a symlink loop leads back to a folder already listed", folder)
                return
            seen.add((st.st_dev, st.st_ino))
            entries = sorted(os.scandir(folder), key=lambda e: e.name)
        except OSError as e:
            log.warning("skipping %s: %s", folder, e.strerror or e)
            return
        for entry in entries:
            if budget[0] <= 0:
                return
            budget[0] -= 1
            try:
                if entry.is_dir():
                    if depth < max_depth and not entry.name.startswith("."):
                        yield from visit(Path(entry.path), depth + 1)
                elif entry.name.endswith(".gguf") and entry.is_file():
                    yield Path(entry.path)
            except OSError as e:  # a link to itself: "too many levels of symbolic links"
                log.warning("skipping %s: %s", entry.path, e.strerror or e)

    if root.is_dir():
        yield from visit(root, 0)
        if budget[0] <= 0:
            log.warning("stopped listing %s after %d entries", root, max_entries)


def _split_first(path: Path) -> int | None:
    """How many files a split GGUF is cut into when path is its first part; 0 for a later part; None: not split."""
    m = _SPLIT.search(path.name)
    if m is None:
        return None
    return int(m.group(2)) if int(m.group(1)) == 1 else 0


def _from_files(root: Path, source: str) -> Iterator[Found]:
    for path in walk_ggufs(root):
        parts = _split_first(path)
        if parts == 0:
            continue  # listed as its first part
        yield Found(path, source, _display(root, path), parts or 1)


def _display(root: Path, path: Path) -> str:
    """publisher/repo/file under LM Studio; for llama.cpp's Hugging Face-style layout user/repo/file."""
    rel = path.relative_to(root).parts
    if rel and rel[0].startswith("models--") and len(rel) >= 4 and rel[1] == "snapshots":
        return "/".join([rel[0].removeprefix("models--").replace("--", "/"), *rel[3:]])
    return "/".join(rel)


def lmstudio_models() -> Iterator[Found]:
    for root in lmstudio_dirs():
        yield from _from_files(root, "lm-studio")


def llamacpp_models() -> Iterator[Found]:
    yield from _from_files(llamacpp_dir(), "llama.cpp")


def ollama_models(max_entries: int = MAX_ENTRIES, root: Path | None = None) -> Iterator[Found]:
    """One entry per manifests/<registry>/<namespace>/<name>/<tag> whose model layer's blob is there."""
    root = root or ollama_dir()
    manifests = root / "manifests"
    if not manifests.is_dir():
        return
    count = 0
    try:
        tags = sorted(manifests.glob("*/*/*/*"))
    except OSError as e:
        log.warning("skipping Ollama's manifests in %s: %s", manifests, e.strerror or e)
        return
    for manifest in tags:
        count += 1
        if count > max_entries:
            log.warning("stopped listing Ollama models after %d manifests", max_entries)
            return
        registry, namespace, name, tag = manifest.relative_to(manifests).parts
        display = f"{name}:{tag}"
        if (registry, namespace) != (OLLAMA_REGISTRY, "library"):
            display = f"{namespace}/{display}" if registry == OLLAMA_REGISTRY else f"{registry}/{namespace}/{display}"
        blob = _ollama_blob(root, manifest)
        if blob is not None:
            yield Found(blob, "ollama", display)


def _ollama_blob(root: Path, manifest: Path) -> Path | None:
    """The model layer's blob, or None (logged) when the manifest is unreadable or the blob is missing."""
    try:
        data = json.loads(manifest.read_text())
        layers = data.get("layers") if isinstance(data, dict) else None
        layer = next(lay for lay in layers if isinstance(lay, dict) and lay.get("mediaType") == OLLAMA_MODEL_LAYER)
        m = _DIGEST.fullmatch(str(layer.get("digest")))
        if m is None:
            raise ValueError(f"model layer digest {layer.get('digest')!r} is not sha256:<64 hex digits>")
    except (OSError, UnicodeDecodeError, ValueError, TypeError, StopIteration) as e:
        why = "no model layer" if isinstance(e, (StopIteration, TypeError)) else getattr(e, "strerror", None) or e
        log.warning("skipping Ollama manifest %s: %s", manifest, why)
        return None
    blob = root / "blobs" / f"sha256-{m.group(1)}"
    if not blob.is_file():
        log.warning("skipping Ollama manifest %s: its model blob %s is missing", manifest, blob.name)
        return None
    return blob


def ollama_name(blob: Path) -> str | None:
    """The name:tag whose model an Ollama blob is (blobs are named by hash), or None when it is not one."""
    if blob.parent.name != "blobs" or not _DIGEST.fullmatch(blob.name):
        return None
    return next((f.name for f in ollama_models(root=blob.parent.parent) if f.path == blob), None)


def other_apps_models() -> Iterator[Found]:
    """Every GGUF LM Studio, Ollama and llama.cpp keep here (none when ENV_SWITCH is off)."""
    if not enabled():
        return
    yield from lmstudio_models()
    yield from ollama_models()
    yield from llamacpp_models()
