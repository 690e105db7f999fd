"""The pre-flight check for Qt's X11 plugin names the missing libraries and the packages to install."""
import subprocess
import sys

from app import platform_check as pc

LDD = """\
\tlinux-vdso.so.1 (0x00007ffd)
\tlibQt6XcbQpa.so.6 => /venv/PySide6/Qt/lib/libQt6XcbQpa.so.6 (0x00007f1)
\tlibxcb-icccm.so.4 => not found
\tlibxcb-cursor.so.0 => not found
\tlibxcb-keysyms.so.1 => not found
\tlibxcb-icccm.so.4 => not found
\tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f2)
"""


def test_missing_libraries_from_ldd_output():
    assert pc.missing_libraries(LDD) == ["libxcb-icccm.so.4", "libxcb-cursor.so.0", "libxcb-keysyms.so.1"]
    assert pc.missing_libraries("\tlibc.so.6 => /lib/libc.so.6 (0x1)\n") == []


def test_debian_package_names():
    assert pc.debian_package("libxcb-cursor.so.0") == "libxcb-cursor0"
    assert pc.debian_package("libxkbcommon-x11.so.0") == "libxkbcommon-x11-0"
    # Not in the table: Debian's rule, with a dash after a name that ends in a digit.
    assert pc.debian_package("libxcb-xfixes.so.0") == "libxcb-xfixes0"
    assert pc.debian_package("libFoo-x11.so.2.1") == "libfoo-x11-2"


def test_needs_xcb_only_where_qt_would_pick_it(monkeypatch):
    monkeypatch.setattr(sys, "platform", "linux")
    assert pc.needs_xcb({"DISPLAY": ":0"})
    assert pc.needs_xcb({"QT_QPA_PLATFORM": "xcb"})
    assert not pc.needs_xcb({"QT_QPA_PLATFORM": "offscreen"})
    assert not pc.needs_xcb({"WAYLAND_DISPLAY": "wayland-0", "DISPLAY": ":0"})
    monkeypatch.setattr(sys, "platform", "darwin")
    assert not pc.needs_xcb({"DISPLAY": ":0"})


def test_check_reports_one_line_with_the_apt_command(monkeypatch, tmp_path):
    plugin = tmp_path / "libqxcb.so"
    plugin.write_bytes(b"")
    monkeypatch.setattr(pc, "xcb_plugin", lambda: plugin)
    monkeypatch.setattr(pc.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, LDD, ""))
    line = pc.check_xcb()
    assert "\n" not in line
    assert "libxcb-cursor.so.0" in line
    assert line.endswith("sudo apt-get install libxcb-icccm4 libxcb-cursor0 libxcb-keysyms1")
    monkeypatch.setattr(pc.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, "", ""))
    assert pc.check_xcb() is None


def test_app_exits_with_the_line_before_any_window(monkeypatch, capsys):
    from app import main

    monkeypatch.setenv("QT_QPA_PLATFORM", "xcb")
    monkeypatch.setattr(pc, "check_xcb", lambda: "speclens: Qt cannot open a window: install libxcb-cursor0")
    assert main.main([]) == 1
    assert capsys.readouterr().err.strip() == "speclens: Qt cannot open a window: install libxcb-cursor0"


def test_no_display_at_all_is_one_line_not_an_abort():
    """With neither DISPLAY nor WAYLAND_DISPLAY, Qt aborted (134) asking for xcb-cursor0."""
    import os
    from pathlib import Path

    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")}
    code = ("import app.platform_check as pc; pc.check_xcb = lambda: None  # the plugin's libraries are all there\n"
            "from app import main; raise SystemExit(main.main([]))")
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip() == pc.check_display({})
    assert "no display to open a window on" in done.stderr and "DISPLAY" in done.stderr
    assert pc.check_display({"DISPLAY": ":0"}) is None
