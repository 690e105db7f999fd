"""Screenshot of the real window mid-reply on the embedded pair, under Xvfb (how docs/screenshot.png was made).

    Xvfb :99 -screen 0 1480x900x24 &
    DISPLAY=:99 SHOT=docs/screenshot.png CMP=docs/compare.png python scripts/screenshot_xvfb.py light

Turn 1 (greedy code), Run > Compare, then turn 2 at temperature 0.8, grabbed from the X screen mid-reply.
"""
import os, sys, tempfile, time
os.environ["QT_QPA_PLATFORM"] = "xcb"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import app
from PySide6.QtWidgets import QApplication
from PySide6.QtCore import QSettings, QTimer, QEventLoop
qa = QApplication([]); qa.setStyle("Fusion"); qa.setApplicationName("SpecLens")
from app.resources import app_icon
qa.setWindowIcon(app_icon())
from app.window import MainWindow
from app.worker import EngineHost
host = EngineHost()
w = MainWindow(host, QSettings(tempfile.mktemp(suffix=".ini"), QSettings.Format.IniFormat))
w.set_theme(sys.argv[1] if len(sys.argv) > 1 else "light")
w.resize(1480, 900); w.show()
def wait(ms):
    l = QEventLoop(); QTimer.singleShot(ms, l.quit); l.exec()
def wait_until(cond, timeout=900):
    t = time.time()
    while not cond():
        wait(20)
        if time.time() - t > timeout: raise TimeoutError
host.scan_models()
t0 = time.time()
w.load_models(None)
wait(300)
if w.load_dialog is not None:
    w.load_dialog.grab().save("/tmp/speclens-load_dialog.png")
wait_until(lambda: host.ready or host.loading is None)
print("loaded", host.info, f"{time.time()-t0:.1f}s", flush=True)
if not host.ready: sys.exit(1)
w.controls.max_tokens_spin.setValue(int(os.environ.get("N1", "60")))
w.controls.k_slider.setValue(5)
w.input.setPlainText("Write a Python function that returns the n-th Fibonacci number iteratively, with a docstring and type hints.")
w.send()
wait_until(lambda: not host.busy)
w.repaint_frame()
s = w.record.summary
print("turn1", s.new_tokens, "tok", f"{s.tokens_per_s:.2f} tok/s", f"acc {s.acceptance_rate:.2f}", "reused", s.reused_prefix_tokens, flush=True)
w.controls.max_tokens_spin.setValue(40)
dlg = w.compare()
wait_until(lambda: not dlg.running)
wait(300)
dlg.grab().save(os.environ.get("CMP", "/tmp/speclens-compare.png"))
print("compare", dlg.verdict and dlg.verdict.text, flush=True)
dlg.close()
w.controls.max_tokens_spin.setValue(int(os.environ.get("N2", "120")))
w.controls.temp_slider.setValue(int(os.environ.get("T2", "80")))
w.input.setPlainText(os.environ.get("P2", "Now explain, in a short paragraph, why the iterative version is faster than the naive recursive one."))
w.send()
wait_until(lambda: w.record.rounds and w.record.rounds[-1].new_tokens >= int(os.environ.get("SHOT_AT", "45")))
wait(400)
qa.primaryScreen().grabWindow(0).save(os.environ.get("SHOT", "/tmp/speclens-real_mid.png"))
print("shot taken", flush=True)
wait_until(lambda: not host.busy)
w.repaint_frame()
s = w.record.summary
print("turn2", s.new_tokens, "tok", f"{s.tokens_per_s:.2f} tok/s", f"acc {s.acceptance_rate:.2f}", "reused", s.reused_prefix_tokens, "of", s.prompt_tokens, flush=True)
w.grab().save("/tmp/speclens-real_done.png")
w.export_stats("/tmp/real_stats.csv")
w.close()
host.shutdown()
