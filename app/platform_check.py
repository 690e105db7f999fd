"""Before any window opens: can Qt's X11 (xcb) platform plugin load?

When a system library the plugin links against is missing, Qt aborts the process with a message that names
neither the library nor the package. A fresh Debian/Ubuntu desktop lacks a few of them (libxcb-cursor0 most
often), so we look first and say in one line what to install.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

# Debian/Ubuntu package for each library the xcb plugin needs that a minimal desktop may lack.
PACKAGES = {
    "libxcb-cursor.so.0": "libxcb-cursor0",
    "libxcb-icccm.so.4": "libxcb-icccm4",
    "libxcb-keysyms.so.1": "libxcb-keysyms1",
    "libxcb-image.so.0": "libxcb-image0",
    "libxcb-render-util.so.0": "libxcb-render-util0",
    "libxcb-shape.so.0": "libxcb-shape0",
    "libxcb-xkb.so.1": "libxcb-xkb1",
    "libxcb-randr.so.0": "libxcb-randr0",
    "libxcb-xinerama.so.0": "libxcb-xinerama0",
    "libxkbcommon-x11.so.0": "libxkbcommon-x11-0",
    "libxkbcommon.so.0": "libxkbcommon0",
    "libX11-xcb.so.1": "libx11-xcb1",
    "libEGL.so.1": "libegl1",
    "libGL.so.1": "libgl1",
    "libfontconfig.so.1": "libfontconfig1",
    "libdbus-1.so.3": "libdbus-1-3",
}
NOT_FOUND = re.compile(r"^\s*(\S+)\s+=>\s+not found", re.MULTILINE)


def debian_package(soname: str) -> str:
    """The package that ships a library: known ones from the table, else Debian's naming rule
    (libfoo-bar.so.N -> libfoo-barN, with a dash when the name already ends in a digit)."""
    if soname in PACKAGES:
        return PACKAGES[soname]
    stem, _, version = soname.partition(".so.")
    stem, version = stem.lower(), version.split(".")[0]
    return f"{stem}{'-' if stem[-1:].isdigit() else ''}{version}"


def missing_libraries(ldd_output: str) -> list[str]:
    """Library names that `ldd` reported as not found, in order, without repeats."""
    return list(dict.fromkeys(NOT_FOUND.findall(ldd_output)))


def xcb_plugin() -> Path | None:
    try:
        import PySide6
    except ImportError:
        return None
    found = sorted(Path(PySide6.__file__).parent.glob("Qt/plugins/platforms/libqxcb.so"))
    return found[0] if found else None


def needs_xcb(env: os._Environ | dict[str, str] = os.environ) -> bool:
    """Qt will pick the xcb plugin: Linux, no other platform asked for, not a Wayland session."""
    if not sys.platform.startswith("linux"):
        return False
    platform = env.get("QT_QPA_PLATFORM", "")
    if platform:
        return platform.split(":")[0] == "xcb"
    return not env.get("WAYLAND_DISPLAY")


def check_display(env: os._Environ | dict[str, str] = os.environ) -> str | None:
    """None when there is a display for the xcb plugin to open; else one line saying so. With none, Qt aborts
    (status 134) saying that xcb-cursor0 is needed, which sends the user after a package they already have."""
    if env.get("DISPLAY"):
        return None
    return ("speclens: there is no display to open a window on (neither DISPLAY nor WAYLAND_DISPLAY is set). "
            "Start SpecLens from a desktop session or with ssh -X; `speclens --load-test` checks an installation "
            "without one.")


def check_xcb() -> str | None:
    """None when the plugin can load (or cannot be checked); else one line saying what to install."""
    plugin = xcb_plugin()
    ldd = shutil.which("ldd")
    if plugin is None or ldd is None:
        return None
    try:
        out = subprocess.run([ldd, str(plugin)], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    missing = missing_libraries(out)
    if not missing:
        return None
    packages = list(dict.fromkeys(debian_package(m) for m in missing))
    return (f"speclens: Qt cannot open a window: its X11 plugin needs {', '.join(missing)}. "
            f"Install with: sudo apt-get install {' '.join(packages)}")
