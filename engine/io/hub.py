"""Find models on this machine: resolve a spec to a local path, and list what can be loaded.

Nothing here downloads: a repo id must already be in the local Hugging Face cache. Besides the embedded pair and
that cache, the GGUFs LM Studio, Ollama and llama.cpp keep (engine.io.model_dirs) are listed, each with whether
SpecLens runs its family (engine.model.families) or why not.
"""
from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from engine.api.config import DENSE_KV_BYTES, GGUF_KV_BYTES
from engine.api.errors import ModelLoadError
from engine.io import model_dirs
from engine.io.safetensors_file import safetensors_files, safetensors_params

if TYPE_CHECKING:
    from huggingface_hub import CachedRepoInfo

# What a malformed entry can raise while being described (a nested GGUF array where a number belongs
# surfaces as TypeError; absurd nesting as RecursionError). Listing skips such an entry, never fails: any other
# Exception is skipped too (an unforeseen one once emptied the whole picker), with its type in the log line.
_BAD_ENTRY = (ModelLoadError, OSError, KeyError, ValueError, TypeError, RecursionError)
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalModel:
    name: str
    path: Path
    source: str  # "embedded", "hf-cache", "folder", "gguf", "lm-studio", "ollama", "llama.cpp"
    arch: str
    vocab_size: int
    num_layers: int
    hidden_size: int
    params_b: float  # approximate, in billions
    context_limit: int = 0  # max_position_embeddings: the longest context its cache may hold
    kv_values_per_token: int = 0  # K and V over every layer: what one token of context costs, in values
    kv_bytes_per_value: int = DENSE_KV_BYTES  # on the CPU (a GPU's bfloat16 is half); GGUF_KV_BYTES for a GGUF
    quant: str = ""  # a GGUF's mix as llama.cpp names it (Q4_K_M, ...); a folder's dtype (BF16, ...)
    why_not: str = ""  # why SpecLens cannot run it, in a sentence; "" when it can
    note: str = ""  # what the user should know about how it runs (a context capped at a sliding window)

    @property
    def runnable(self) -> bool:
        return not self.why_not


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
        if not is_gguf(path):
            raise ModelLoadError(f"{path}: not a .gguf file or a model folder")
        return path
    if not (path / "config.json").is_file():
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            return ggufs[0]
        if len(ggufs) > 1:
            raise ModelLoadError(f"{path}: holds several .gguf files ({', '.join(g.name for g in ggufs)}); pass one of them")
    return path


def is_gguf(path: Path) -> bool:
    """A .gguf file, or a file that starts as one (Ollama keeps its models as blobs named by their hash)."""
    if path.suffix == ".gguf":
        return True
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def label(spec: str | Path, path: Path) -> str:
    """A human name: the repo id for HF-cache paths, else the folder name or file stem."""
    parts = path.parts
    for i, p in enumerate(parts):
        if p.startswith("models--") and i + 2 < len(parts) and parts[i + 1] == "snapshots":
            repo = p.removeprefix("models--").replace("--", "/")
            return repo if path.suffix != ".gguf" else f"{repo}/{path.name}"
    if path.suffix != ".gguf" and (ollama := model_dirs.ollama_name(path)):
        return ollama
    return path.stem if path.suffix == ".gguf" else path.name


def describe(path: Path, source: str, name: str | None = None) -> LocalModel:
    """Cheap facts about a model (config and weight headers only; no tensor data is read). A model of a family
    SpecLens does not run is described with why_not; a damaged one raises."""
    if path.is_file():  # a .gguf, or the first part of a split one
        return _describe_gguf(path, source, name or label(path, path), check_data=False)
    try:
        cfg = json.loads((path / "config.json").read_text())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: unreadable config.json: {e}") from e
    if not isinstance(cfg, dict):
        raise ModelLoadError(f"{path}: config.json holds a JSON {type(cfg).__name__}, not an object")
    from engine.api.config import ModelConfig

    n = sum(safetensors_params(f) for f in safetensors_files(path))
    dtype = _FOLDER_DTYPES.get(str(cfg.get("torch_dtype") or cfg.get("dtype")), "")
    try:
        c = ModelConfig.from_hf(cfg)
    except KeyError as e:
        raise ModelLoadError(f"{path}: config.json lacks {e}") from e
    except ValueError as e:  # a family or field the engine does not compute: listed with the reason
        keys = ("vocab_size", "num_hidden_layers", "hidden_size", "max_position_embeddings")
        facts = [_count(cfg.get(k)) for k in keys]
        return LocalModel(name or label(path, path), path, source, str(cfg.get("model_type", "?")), *facts[:3],
                          float(f"{n / 1e9:.3g}"), facts[3], quant=dtype, why_not=str(e))
    return LocalModel(name or label(path, path), path, source, c.arch, c.vocab_size, c.num_layers, c.hidden_size,
                      float(f"{n / 1e9:.3g}"), c.max_position_embeddings,
                      2 * c.num_layers * c.num_kv_heads * c.head_dim, DENSE_KV_BYTES, quant=dtype, note=c.context_note)


_FOLDER_DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64"}


def _count(v: object) -> int:
    """A header's count as an int, 0 where it is missing or not a count (a malformed entry still lists)."""
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 0 else 0


def _describe_gguf(path: Path, source: str, name: str, check_data: bool, parts: int = 1) -> LocalModel:
    """check_data: refuse a file shorter than its tensors (a truncated download); off for the first part of an
    embedded model not assembled yet, whose header is all that is read."""
    from engine.io.gguf_file import GGUFFile
    from engine.model.gguf_refusal import gguf_refusal

    gf = GGUFFile(path, check_data=check_data and parts == 1)
    why = gguf_refusal(gf.arch, gf.metadata, gf.tensors)
    if gf.arch == "clip":
        why = "a vision projector (mmproj) for another model, not a language model"
    elif parts > 1:
        why = (f"split into {parts} files; SpecLens loads one-file GGUFs (llama.cpp's llama-gguf-split --merge "
               "joins them)")
    n = _params_b(gf)
    if why is None:  # a runnable family: its header must make a config, else the entry is damaged
        c = gf.config()
        return LocalModel(name, path, source, c.arch, c.vocab_size, c.num_layers, c.hidden_size, n,
                          c.max_position_embeddings, 2 * c.num_layers * c.num_kv_heads * c.head_dim, GGUF_KV_BYTES,
                          quant=_quant(gf))
    meta = gf.metadata
    embd = gf.tensors.get("token_embd.weight")
    vocab = embd.shape[0] if embd is not None and embd.shape else len(meta.get("tokenizer.ggml.tokens") or ())
    layers, hidden, context = (_count(meta.get(f"{gf.arch}.{k}"))
                               for k in ("block_count", "embedding_length", "context_length"))
    return LocalModel(name, path, source, gf.arch or "?", _count(vocab), layers, hidden, n, context,
                      kv_bytes_per_value=GGUF_KV_BYTES, quant=_quant(gf), why_not=why)


_SIZE_LABEL = re.compile(r"(\d{1,4}(?:\.\d{1,3})?)([KMBT])")  # general.size_label: "0.5B", "270M"; not "8x7B"
_SIZE_UNIT = {"K": 1e-6, "M": 1e-3, "B": 1.0, "T": 1e3}


def _params_b(gf) -> float:
    """The parameter count in billions as the model is known: the converter's size label (the checkpoint's own
    count) where it is plausible, else the file's tensors counted. A file that stores a tied head twice (the Qwen2.5
    0.5B GGUFs do) counts 0.63B for a model its makers call 0.5B; a label far from the count is not believed."""
    counted = gf.num_params / 1e9
    label = gf.metadata.get("general.size_label")
    m = _SIZE_LABEL.fullmatch(label.strip()) if isinstance(label, str) and len(label) <= 16 else None
    if m is not None:
        named = float(m.group(1)) * _SIZE_UNIT[m.group(2)]
        if 0.5 * counted <= named <= 1.25 * counted:
            return named
    return float(f"{counted:.3g}")


def _quant(gf) -> str:
    """The file's quantization as llama.cpp names it; unstated, the block type holding most of its matrices' weights."""
    if gf.file_type != "GGUF":
        return gf.file_type
    weights: dict[str, int] = {}
    for t in gf.tensors.values():
        if len(t.shape) == 2:
            weights[t.qtype.name] = weights.get(t.qtype.name, 0) + t.numel
    return max(weights, key=weights.get) if weights else ""


def describe_found(found: model_dirs.Found) -> LocalModel:
    """A model another app keeps: its GGUF checked whole (a truncated download raises, and is skipped)."""
    return _describe_gguf(found.path, found.source, found.name, check_data=True, parts=found.parts)


def list_local_models(include_unrunnable: bool = False) -> list[LocalModel]:
    """The embedded pair (when provisioned or provisionable), then the models in the HF cache, then those LM Studio,
    Ollama and llama.cpp keep. A broken entry is skipped with a log line, never fatal; one of a family SpecLens
    does not run only with include_unrunnable (its why_not says why)."""
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
            if m.runnable or include_unrunnable:
                out.append(m)
    for found in model_dirs.other_apps_models():
        try:
            m = describe_found(found)
        except Exception as e:  # noqa: BLE001 - one bad entry never hides the others
            log.warning("skipping %s model %s (%s): %s", found.source, found.name, found.path, _why(e))
            continue
        if m.runnable or include_unrunnable:
            out.append(m)
    return out


def _why(e: Exception) -> str:
    """A foreseen problem says itself; an unforeseen one also names its type, for a bug report."""
    return str(e) if isinstance(e, _BAD_ENTRY) else f"{type(e).__name__}: {e}"
