"""Screenshots of a load without compiled kernels (never silently slow), under Xvfb.

    Xvfb :99 -screen 0 1480x900x24 &
    DISPLAY=:99 python -m scripts.screenshots.fallback light /tmp/fallback
    DISPLAY=:99 COMPILE=1 python -m scripts.screenshots.fallback light /tmp/compile   # the first-use compile instead

With COMPILE=1 the compiler stays: the dialog is grabbed while the kernels compile into the empty cache (about a
minute), and the load then goes on with them.

The engine process gets an empty SPECLENS_CACHE and CXX pointing at no compiler, so the kernels can be neither
found nor built; the embedded pair is loaded from its files in the usual cache. Saves DIR/load_dialog.png (the load
dialog while the models are placed, the sentence under the step) and DIR/window.png (the status line after the
load), and prints the sentence. docs/images/kernels-fallback-dialog.png and kernels-fallback-status.png are those
two; docs/images/kernels-compile-dialog.png is the COMPILE=1 dialog.
"""
import os
import sys
import tempfile
from pathlib import Path

from scripts.screenshots import xvfb_window


def main() -> int:
    out = Path(sys.argv[2] if len(sys.argv) > 2 else "/tmp/fallback")
    out.mkdir(parents=True, exist_ok=True)
    from engine.io.provision import default_pair

    target, draft = default_pair()  # in the usual cache, before the engine's cache is pointed elsewhere
    os.environ["SPECLENS_CACHE"] = tempfile.mkdtemp(prefix="speclens-empty-")  # read by the engine process
    compile_ = os.environ.get("COMPILE") == "1"
    if not compile_:
        os.environ["CXX"] = "no-such-c++"
    os.environ["SPECLENS_QUANT_PREBUILT"] = "0"
    qa, controller, w = xvfb_window.open_window()
    w.load_models(str(target), str(draft))
    wanted = (lambda t: t.startswith("Compiling the CPU kernels") and t.endswith(": 12 s")) if compile_ else \
        (lambda t: "CPU kernels" in t and " s\n" in t)
    xvfb_window.wait_until(lambda: w.load_dialog is not None and wanted(w.load_dialog.labelText()), timeout=300)
    xvfb_window.wait(300 if compile_ else 1200)
    qa.primaryScreen().grabWindow(0).save(str(out / "load_dialog.png"))
    xvfb_window.wait_until(lambda: not controller.loading, timeout=900)
    xvfb_window.wait(500)
    qa.primaryScreen().grabWindow(0).save(str(out / "window.png"))
    print("loaded:", controller.info)
    print("status line:", w.notice_label.text() if w.notice_label.isVisible() else "(none)")
    w.close()
    return 0 if controller.ready and w.notice_label.isVisible() != compile_ else 1


if __name__ == "__main__":
    sys.exit(main())
