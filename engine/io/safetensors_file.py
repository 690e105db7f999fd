"""Safetensors weight files: which files an HF folder holds, and reading them with errors that name the file."""
from __future__ import annotations

import json
import math
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from engine.api.errors import ModelLoadError


def safetensors_files(folder: Path) -> list[Path]:
    """The weight files of an HF folder: model.safetensors, or the shards its index lists."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, ValueError, KeyError, AttributeError) as e:
            raise ModelLoadError(f"{index}: invalid shard index: {e}") from e
        missing = [n for n in names if not (folder / n).is_file()]
        if missing:
            raise ModelLoadError(f"{folder}: shard(s) listed in model.safetensors.index.json are missing: {', '.join(missing)}")
        return [folder / n for n in names]
    if (folder / "model.safetensors").is_file():
        return [folder / "model.safetensors"]
    shards = sorted(folder.glob("model-*-of-*.safetensors"))
    if shards:
        return shards
    hint = " (only PyTorch .bin weights found; SpecLens reads safetensors)" if any(folder.glob("*.bin")) else ""
    raise ModelLoadError(f"{folder}: no model.safetensors or model-0000x-of-0000y.safetensors{hint}")


@contextmanager
def open_safetensors(path: Path) -> Iterator[safe_open]:
    """`safetensors.safe_open` (memory-mapped; it checks the header against the file's length before any
    tensor is read), with the library's and the OS's errors turned into a ModelLoadError naming the file."""
    try:
        with safe_open(path, framework="pt") as f:
            yield f
    except SafetensorError as e:
        reason = str(e).removeprefix("Error while deserializing header: ")
        # The library words a file shorter (or longer) than its header describes as "incomplete metadata,
        # file not fully covered": nearly always an interrupted copy or download, so say so plainly.
        kind = "truncated" if "not fully covered" in reason else "corrupt"
        raise ModelLoadError(f"{path}: {kind} safetensors file ({_size(path)} bytes): {reason}") from e
    except OSError as e:
        raise ModelLoadError(f"{path}: cannot read: {e.strerror or e}") from e


def _size(path: Path) -> int | str:
    try:
        return path.stat().st_size
    except OSError:
        return "?"


def read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Every tensor in the file. The library maps the file privately (copy-on-write), so the tensors are views
    of it: nothing is read until used, and writing to a tensor never reaches the file."""
    with open_safetensors(path) as f:
        return {name: f.get_tensor(name) for name in f.keys()}


def safetensors_params(path: Path) -> int:
    """How many numbers the file holds, from its header alone (no tensor data is read)."""
    with open_safetensors(path) as f:
        return sum(math.prod(f.get_slice(name).get_shape()) for name in f.keys())
