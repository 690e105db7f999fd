"""The window fits a 1280x800 screen with the inspector and step-through open: opening them grew it to 1,753 px on a
1,600-px screen, and the inspector and the side panel went off the edge. Offscreen, in a process of its own whose
one screen is 1280x800 (the test session's offscreen screen is another size)."""
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

CHECK = textwrap.dedent('''
    import json, sys, tempfile, time
    from PySide6.QtCore import QSettings
    from PySide6.QtWidgets import QApplication

    app = QApplication([])
    from app.controller import ChatController
    from app.host import EngineHost
    from app.views.window import MainWindow
    from engine.api.events import Phase, PhaseEvent
    from engine.service.loaders import Factory

    def pump(seconds=0.3):
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            app.processEvents()

    host = EngineHost(Factory("tests.app_fixtures:fake_loader", {}),
                      Factory("tests.app_fixtures:listed_models", {"names": []}))
    c = ChatController(host)
    w = MainWindow(c, QSettings(tempfile.mktemp(suffix=".ini"), QSettings.Format.IniFormat))
    if sys.argv[1] == "restored":  # a geometry saved on a larger screen
        w.setGeometry(0, 0, 1900, 1150)
    w.show()
    c.load()
    end = time.monotonic() + 60
    while not c.ready and time.monotonic() < end:
        pump(0.05)
    w.input.setPlainText("Write fib")
    w.send()
    end = time.monotonic() + 60
    while (c.busy or w.frame_timer.isActive()) and time.monotonic() < end:
        pump(0.05)
    pump()
    w.inspector.show_token(w.chat.infos[3])  # a click on a token
    w.stepper.toggle_action.setChecked(True)
    # A wide phase: sixteen drafts with long texts, a long title
    texts = tuple(f" token_{i}_with_a_long_name" for i in range(16))
    w.stepper.show_phase(PhaseEvent(7, Phase.VERIFIED, "model", 16, tuple(range(16)), texts,
                                    (0.5,) * 16, (0.4,) * 16))
    pump(1.0)
    screen = app.primaryScreen().availableGeometry()

    def rect(widget):
        top_left = widget.mapToGlobal(widget.rect().topLeft())
        return [top_left.x(), top_left.y(), widget.width(), widget.height()]

    f = w.frameGeometry()
    print(json.dumps({
        "screen": [screen.x(), screen.y(), screen.width(), screen.height()],
        "frame": [f.x(), f.y(), f.width(), f.height()],
        "panels": {"chat": rect(w.chat), "charts": rect(w.charts), "controls": rect(w.controls.parentWidget()),
                   "inspector": rect(w.inspector), "stepper": rect(w.stepper)},
        "visible": [w.inspector.isVisible(), w.stepper.isVisible(), w.charts.isVisible()],
    }))
    w.close()
    c.shutdown()
''')


def run(case: str, folder: Path) -> dict:
    screens = {"screens": [{"name": "s", "x": 0, "y": 0, "width": 1280, "height": 800, "logicalDpi": 96,
                            "logicalBaseDpi": 96, "dpr": 1}]}
    config = folder / "screen-1280x800.json"
    config.write_text(json.dumps(screens))
    env = dict(os.environ, QT_QPA_PLATFORM=f"offscreen:configfile={config}")
    out = subprocess.run([sys.executable, "-c", CHECK, case], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def inside(outer, inner) -> bool:
    ox, oy, ow, oh = outer
    x, y, w, h = inner
    return ox <= x and oy <= y and x + w <= ox + ow and y + h <= oy + oh


def test_inspector_and_step_through_fit_a_1280x800_screen(tmp_path):
    for case in ("first", "restored"):
        got = run(case, tmp_path)
        assert got["screen"] == [0, 0, 1280, 800], got
        assert inside(got["screen"], got["frame"]), (case, got)
        assert all(got["visible"]), (case, got)
        for name, r in got["panels"].items():
            assert r[2] >= 100 and r[3] >= 50, (case, name, r)  # on screen with room to read, not squeezed away
            assert inside(got["frame"], r), (case, name, r, got["frame"])
