"""Finding bundled files: resources/ beside the package, or inside a PyInstaller bundle."""
from __future__ import annotations

import sys
from pathlib import Path

from PySide6.QtGui import QIcon


def resources_dir() -> Path:
    frozen = getattr(sys, "_MEIPASS", None)
    if frozen:
        return Path(frozen) / "resources"
    return Path(__file__).resolve().parents[2] / "resources"


def resource_path(name: str) -> Path:
    return resources_dir() / name


def app_icon() -> QIcon:
    """The SpecLens icon (SVG for every size, PNG as a fallback); an empty icon if neither is found."""
    icon = QIcon()
    for name in ("speclens.svg", "speclens.png"):
        path = resource_path(name)
        if path.is_file():
            icon.addFile(str(path))
    return icon
