"""Packaging: the entry point starts and quits cleanly; the spec, desktop entry and icons are sound."""
import ast
import configparser
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_smoke_test_entry_point(tmp_path):
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    ini = tmp_path / "smoke.ini"
    out = subprocess.run([sys.executable, "-m", "app.main", "--smoke-test", "--settings", str(ini)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "smoke-test ok" in out.stdout
    assert ini.exists()  # settings went to the file we named, not the user's


def load_test(tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    env.pop("DISPLAY", None)
    return subprocess.run([sys.executable, "-m", "app.main", "--load-test", "--settings", str(tmp_path / "l.ini"),
                           *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)


def test_load_test_runs_the_launch_path_until_the_pair_is_loaded(tmp_path):
    """What a launch runs: the engine process spawned before Qt and taken over by the host, the load, the
    window; it quits once the pair is loaded."""
    from tests.tiny import (
        ENGINE_CFG,
        draft_weights,
        hf_model,
        save_folder,
        tiny_tokenizer,
    )

    target, draft = hf_model(ENGINE_CFG, 0), hf_model(ENGINE_CFG, 0)
    draft.load_state_dict(draft_weights(dict(target.state_dict()), 0.03, 1))
    t, d = save_folder(target, tiny_tokenizer(), tmp_path / "t"), save_folder(draft, tiny_tokenizer(), tmp_path / "d")
    out = load_test(tmp_path, "--target", str(t), "--draft", str(d))
    assert out.returncode == 0, out.stdout + out.stderr
    line = out.stdout.strip().splitlines()[-1]
    assert line.startswith("load-test ok: t + d on cpu") and line.endswith("s after start"), line


def test_load_test_fails_with_the_reason(tmp_path):
    out = load_test(tmp_path, "--target", str(tmp_path / "no-such-model"))
    assert out.returncode == 1, out.stdout + out.stderr
    line = out.stdout.strip().splitlines()[-1]
    assert line.startswith("load-test failed: ") and "no-such-model" in line, line
    assert "Could not load the model: " in out.stderr  # the window's error, printed: no dialog waits for a click


def test_smoke_test_loads_no_engine(tmp_path):
    code = ("import sys; from app.main import main; rc = main(['--smoke-test', '--settings', sys.argv[1]]); "
            "print('torch' in sys.modules, 'engine.runtime.engine' in sys.modules); sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s.ini")], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, env=dict(os.environ, QT_QPA_PLATFORM="offscreen"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False False"


def test_gui_process_never_imports_torch():
    """Everything the GUI process imports, the window, controller and host included: no torch (the engine
    runs in its own process). This test's own process has torch (tests/conftest.py), so it asks a fresh one."""
    code = ("import app.main, app.views.window, app.controller, app.host, app.dialogs.compare, app.views.charts; "
            "import sys; "
            "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'transformers'))); "
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, QT_QPA_PLATFORM="offscreen"))
    assert out.returncode == 0, out.stdout + out.stderr


def test_app_modules_never_import_the_engine_core():
    """No app module imports torch or the engine's torch modules, even lazily: only engine/service/, in the
    engine process, does."""
    for path in (ROOT / "app").rglob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not name.startswith("torch") and name not in (
                    "engine.runtime.engine", "engine.io.provision", "engine.io.loading", "engine.model.transformer", "engine.io.hub"), \
                    f"{path.name} imports {name}"


def test_spec_file_parses_and_names_the_entry_point():
    spec = ROOT / "packaging" / "speclens.spec"
    tree = ast.parse(spec.read_text(), filename=str(spec))
    compile(tree, str(spec), "exec")
    text = spec.read_text()
    assert '"app" / "main.py"' in text and '"resources"' in text
    calls = {n.func.id for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)}
    assert {"Analysis", "PYZ", "EXE", "COLLECT"} <= calls


def test_desktop_entry():
    cp = configparser.ConfigParser(interpolation=None)
    cp.optionxform = str
    cp.read(ROOT / "resources" / "speclens.desktop")
    entry = cp["Desktop Entry"]
    assert entry["Type"] == "Application" and entry["Exec"] == "speclens" and entry["Icon"] == "speclens"
    assert entry["Terminal"] == "false" and entry["Categories"].endswith(";")


def test_icons_render(qapp):
    from PySide6.QtGui import QImage
    from PySide6.QtSvg import QSvgRenderer

    from app.views.resources import app_icon

    assert QSvgRenderer(str(ROOT / "resources" / "speclens.svg")).isValid()
    png = QImage(str(ROOT / "resources" / "speclens.png"))
    assert not png.isNull() and png.width() == png.height() >= 128
    assert not app_icon().isNull()


def test_a_refused_target_prints_its_reason_without_a_traceback(tmp_path):
    """The engine process logged a Python traceback for a path that does not exist."""
    out = load_test(tmp_path, "--target", str(tmp_path / "no-such-model"))
    assert out.returncode == 1
    assert "Traceback" not in out.stderr and "no-such-model" in out.stderr, out.stderr
