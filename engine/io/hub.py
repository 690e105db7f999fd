"""Find models on this machine: resolve a spec to a local path, and list what can be loaded.

Nothing here downloads: a repo id must already be in the local Hugging Face cache.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from engine.api.config import DENSE_KV_BYTES, GGUF_KV_BYTES
from engine.api.errors import ModelLoadError
from engine.io.safetensors_file import safetensors_files, safetensors_params

if TYPE_CHECKING:
    from huggingface_hub import CachedRepoInfo

COMPATIBLE = ("llama", "qwen2", "mistral")
# What a malformed entry can raise while being described (a nested GGUF array where a number belongs
# surfaces as TypeError; absurd nesting as RecursionError). Listing skips such an entry, never fails: any other
# Exception is skipped too (an unforeseen one once emptied the whole picker), with its type in the log line.
_BAD_ENTRY = (ModelLoadError, OSError, KeyError, ValueError, TypeError, RecursionError)
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalModel:
    name: str
    path: Path
    source: str  # "embedded", "hf-cache", "folder", "gguf"
    arch: str
    vocab_size: int
    num_layers: int
    hidden_size: int
    params_b: float  # approximate, in billions
    context_limit: int = 0  # max_position_embeddings: the longest context its cache may hold
    kv_values_per_token: int = 0  # K and V over every layer: what one token of context costs, in values
    kv_bytes_per_value: int = DENSE_KV_BYTES  # on the CPU (a GPU's bfloat16 is half); GGUF_KV_BYTES for a GGUF


def hf_cache_dir() -> Path:
    """The Hugging Face cache folder, found as huggingface_hub finds it: HF_HUB_CACHE (or its legacy name
    HUGGINGFACE_HUB_CACHE), else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
    ~/.cache/huggingface/hub. Read at each call: huggingface_hub reads these once, at import, into its
    constants, so every call below passes this folder explicitly."""
    env = os.environ.get
    if env("HF_HUB_CACHE") or env("HUGGINGFACE_HUB_CACHE"):
        return Path(env("HF_HUB_CACHE") or env("HUGGINGFACE_HUB_CACHE")).expanduser()
    if env("HF_HOME"):
        return Path(env("HF_HOME")).expanduser() / "hub"
    return Path(env("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "huggingface" / "hub"


def snapshot(repo: CachedRepoInfo) -> Path | None:
    """The snapshot refs/main points at, else the newest one (a repo fetched only by revision has no main)."""
    rev = (next((r for r in repo.revisions if "main" in r.refs), None)
           or max(repo.revisions, key=lambda r: r.last_modified, default=None))
    return rev.snapshot_path if rev else None


def _scan_cache(cache: Path) -> list[CachedRepoInfo]:
    """The model repos in the cache, by repo id. A repo huggingface_hub finds corrupt (no snapshots folder, a
    ref to a missing snapshot, a broken blob link) is left out with a logged warning."""
    from huggingface_hub import CacheNotFound, scan_cache_dir

    try:
        info = scan_cache_dir(cache)
    except CacheNotFound:
        return []
    except (OSError, ValueError) as e:  # an unreadable file, or the cache is a file: the scan stops at it
        log.warning("skipping the Hugging Face cache %s: %s", cache, e)
        return []
    for problem in info.warnings:
        log.warning("skipping a Hugging Face cache entry: %s", problem)
    return sorted((r for r in info.repos if r.repo_type == "model"), key=lambda r: r.repo_id)


def _cached_repo_snapshot(repo_id: str) -> Path:
    """The local snapshot of a repo id: refs/main's, else the newest. Never downloads."""
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import IncompleteSnapshotError, LocalEntryNotFoundError
    from huggingface_hub.file_download import repo_folder_name

    cache = hf_cache_dir()
    try:
        return Path(snapshot_download(repo_id, cache_dir=cache, local_files_only=True))
    except IncompleteSnapshotError as e:  # an interrupted download that huggingface_hub knows is partial
        raise ModelLoadError(f"{repo_id!r}: {e}") from e
    except (LocalEntryNotFoundError, ValueError):  # ValueError: not a valid repo id (HFValidationError)
        pass
    # No refs/main: the newest snapshot, if the repo is there at all.
    repo = next((r for r in _scan_cache(cache) if r.repo_id == repo_id), None)
    snap = snapshot(repo) if repo else None
    if snap is None:
        where = cache / repo_folder_name(repo_id=repo_id, repo_type="model")
        raise ModelLoadError(f"{repo_id!r} is not a local path, and no such repo is in the local Hugging Face "
                             f"cache (looked for {where}); SpecLens never downloads models")
    return snap


def _looks_like_repo_id(spec: str) -> bool:
    parts = spec.split("/")
    return len(parts) == 2 and all(parts) and not spec.startswith((".", "~")) and "\\" not in spec


def resolve(spec: str | Path) -> Path:
    """A folder, a .gguf file, or a repo id in the local HF cache -> a local path.
    A folder without config.json that holds exactly one .gguf resolves to that file."""
    if not str(spec).strip():
        raise ModelLoadError("empty model path")
    path = Path(spec).expanduser()
    if not path.exists():
        if isinstance(spec, str) and _looks_like_repo_id(spec):
            path = _cached_repo_snapshot(spec)
        else:
            raise ModelLoadError(f"{path}: no such file or folder")
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelLoadError(f"{path}: not a .gguf file or a model folder")
        return path
    if not (path / "config.json").is_file():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ggufs[0]
        if len(ggufs) > 1:
            raise ModelLoadError(f"{path}: holds several .gguf files ({', '.join(g.name for g in ggufs)}); pass one of them")
    return path


def label(spec: str | Path, path: Path) -> str:
    """A human name: the repo id for HF-cache paths, else the folder name or file stem."""
    parts = path.parts
    for i, p in enumerate(parts):
        if p.startswith("models--") and i + 2 < len(parts) and parts[i + 1] == "snapshots":
            repo = p.removeprefix("models--").replace("--", "/")
            return repo if path.suffix != ".gguf" else f"{repo}/{path.name}"
    return path.stem if path.suffix == ".gguf" else path.name


def describe(path: Path, source: str, name: str | None = None) -> LocalModel:
    """Cheap facts about a model (config and weight headers only; no tensor data is read)."""
    is_gguf = path.is_file()
    if is_gguf:  # a .gguf, or the first part of a split one
        from engine.io.gguf_file import GGUFFile

        gf = GGUFFile(path, check_data=False)
        c = gf.config()
        n = gf.num_params
    else:
        try:
            cfg = json.loads((path / "config.json").read_text())
        except (OSError, ValueError) as e:
            raise ModelLoadError(f"{path}: unreadable config.json: {e}") from e
        if not isinstance(cfg, dict):
            raise ModelLoadError(f"{path}: config.json holds a JSON {type(cfg).__name__}, not an object")
        from engine.api.config import ModelConfig

        try:
            c = ModelConfig.from_hf(cfg)
        except (KeyError, ValueError) as e:
            raise ModelLoadError(f"{path}: {e}") from e
        n = sum(safetensors_params(f) for f in safetensors_files(path))
    return LocalModel(name or label(path, path), path, source, c.arch, c.vocab_size, c.num_layers, c.hidden_size,
                      float(f"{n / 1e9:.3g}"), c.max_position_embeddings,
                      2 * c.num_layers * c.num_kv_heads * c.head_dim, GGUF_KV_BYTES if is_gguf else DENSE_KV_BYTES)


def list_local_models() -> list[LocalModel]:
    """The embedded pair (when provisioned or provisionable), then compatible models in the HF cache.
    A broken or unsupported entry is skipped, never fatal."""
    from engine.io import provision

    out: list[LocalModel] = []
    for ps in (provision.TARGET, provision.DRAFT):
        file = provision.model_file(ps)
        try:
            if provision.is_trusted(file, ps):
                m = describe(file, "embedded", ps.name)
            else:  # not assembled yet: read the GGUF header from the first installed part
                m = describe(provision.locate_part(ps.packages[0]), "embedded", ps.name)
            out.append(replace(m, path=file))
        except Exception as e:  # noqa: BLE001 - one bad entry never hides the others
            if not isinstance(e, provision.ProvisionError):  # not installed is normal; broken is worth a line
                log.warning("skipping embedded model %s: %s", ps.name, _why(e))
            continue
    for repo in _scan_cache(hf_cache_dir()):
        snap = snapshot(repo)
        if snap is None:
            continue
        candidates = [(snap, "hf-cache")] if (snap / "config.json").is_file() else []
        candidates += [(g, "gguf") for g in sorted(snap.glob("*.gguf"))]
        for path, source in candidates:
            try:
                m = describe(path, source)
            except Exception as e:  # noqa: BLE001 - one bad entry never hides the others
                log.warning("skipping %s: %s", path, _why(e))
                continue
            if m.arch in COMPATIBLE:
                out.append(m)
    return out


def _why(e: Exception) -> str:
    """A foreseen problem says itself; an unforeseen one also names its type, for a bug report."""
    return str(e) if isinstance(e, _BAD_ENTRY) else f"{type(e).__name__}: {e}"
