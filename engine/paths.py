"""Where SpecLens keeps what it makes on the user's machine: the assembled GGUF files and the compiled kernels."""
from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """$SPECLENS_CACHE, else $XDG_CACHE_HOME/speclens, else ~/.cache/speclens."""
    if os.environ.get("SPECLENS_CACHE"):
        return Path(os.environ["SPECLENS_CACHE"]).expanduser()
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]).expanduser() / "speclens"
    return Path.home() / ".cache" / "speclens"
