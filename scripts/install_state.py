"""Whether scripts/install.sh can skip pip: `check EXTRAS` exits 0 when this environment was installed from this
checkout with the same pyproject.toml and extras, and every distribution that install asked for is still there;
`record EXTRAS` notes an install (with the extras recorded before from the same source: installing "test" keeps
"default-models").

pip takes ~8 s even when there is nothing to do, and run-app.sh runs install.sh at every launch. The note lives
in the environment itself (sys.prefix), so a new or another environment installs again.
"""
from __future__ import annotations

import hashlib
import importlib.metadata as md
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAMP = Path(sys.prefix) / ".speclens-installed"


def source() -> dict[str, str]:
    return {"pyproject": hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest(), "checkout": str(ROOT)}


def recorded_extras() -> set[str]:
    """The extras installed from this very source (none when the note is missing or from another source)."""
    try:
        note = json.loads(STAMP.read_text())
    except (OSError, ValueError):
        return set()
    return set(note.get("extras", [])) if note.get("source") == source() else set()


def missing(extras: str) -> list[str]:
    """Distributions speclens requires (with these extras) that are not installed; ["speclens"] if it is not."""
    try:
        requires = md.requires("speclens") or []
    except md.PackageNotFoundError:
        return ["speclens"]
    wanted, out = set(extras.split(",")), []
    for req in requires:
        extra = re.search(r"extra\s*==\s*['\"]([^'\"]+)['\"]", req)
        if extra and extra.group(1) not in wanted:
            continue
        name = re.match(r"[A-Za-z0-9_.\-]+", req).group(0)
        try:
            md.version(name)
        except md.PackageNotFoundError:
            out.append(name)
    return out


def main(argv: list[str]) -> int:
    what, extras = argv[1], argv[2]
    wanted = set(extras.split(","))
    if what == "check":
        return 0 if wanted <= recorded_extras() and not missing(extras) else 1
    STAMP.write_text(json.dumps({"source": source(), "extras": sorted(wanted | recorded_extras())}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
