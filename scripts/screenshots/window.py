"""Screenshots of the real window under Xvfb (how docs/images/screenshot.png was made).

    Xvfb :99 -screen 0 1480x900x24 &
    DISPLAY=:99 SHOT=docs/images/screenshot.png CMP=docs/images/compare.png python -m scripts.screenshots.window light
    DISPLAY=:99 CRASH=/tmp/crash.png python -m scripts.screenshots.window light     # plus the crash banner

Turn 1 (greedy code), Run > Compare, then turn 2 at temperature 0.8, grabbed from the X screen mid-reply. With
CRASH set, the engine process is then killed (SIGKILL) in the middle of turn 3, and the window is grabbed showing
how it reports that. MODELS=tiny runs the tiny random pair of tests/tiny.py instead of the embedded one.
"""
import functools
import os
import signal
import sys

from scripts.screenshots import xvfb_window


def main() -> int:
    qa, controller, w = xvfb_window.open_window({"round_delay": 0.03})
    wait = xvfb_window.wait
    wait_until = functools.partial(xvfb_window.wait_until, timeout=900)
    idle = functools.partial(xvfb_window.idle, controller, w)

    def shoot_dialog() -> None:
        if w.load_dialog is not None:
            w.load_dialog.grab().save("/tmp/speclens-load_dialog.png")

    if not xvfb_window.load_pair(controller, w, on_shown=shoot_dialog):
        return 1
    w.controls.max_tokens_spin.setValue(int(os.environ.get("N1", "60")))
    w.controls.k_slider.setValue(5)
    w.input.setPlainText("Write a Python function that returns the n-th Fibonacci number iteratively, with a "
                         "docstring and type hints.")
    w.send()
    record = controller.active.record
    wait_until(idle)
    s = record.summary
    print("turn1", s.new_tokens, "tok", f"{s.tokens_per_s:.2f} tok/s", f"acc {s.acceptance_rate:.2f}", "reused",
          s.reused_prefix_tokens, flush=True)
    w.controls.max_tokens_spin.setValue(40)
    dlg = w.compare()
    wait_until(lambda: not dlg.running)
    wait(300)
    dlg.grab().save(os.environ.get("CMP", "/tmp/speclens-compare.png"))
    print("compare", dlg.verdict and dlg.verdict.text, flush=True)
    dlg.close()
    wait_until(idle)
    w.controls.max_tokens_spin.setValue(int(os.environ.get("N2", "120")))
    w.controls.temp_slider.setValue(int(os.environ.get("T2", "80")))
    w.input.setPlainText(os.environ.get("P2", "Now explain, in a short paragraph, why the iterative version is "
                                              "faster than the naive recursive one."))
    w.send()
    record = controller.active.record
    wait_until(lambda: record.rounds and record.rounds[-1].new_tokens >= int(os.environ.get("SHOT_AT", "45")))
    wait(400)
    qa.primaryScreen().grabWindow(0).save(os.environ.get("SHOT", "/tmp/speclens-real_mid.png"))
    print("shot taken", flush=True)
    wait_until(idle)
    s = record.summary
    print("turn2", s.new_tokens, "tok", f"{s.tokens_per_s:.2f} tok/s", f"acc {s.acceptance_rate:.2f}", "reused",
          s.reused_prefix_tokens, "of", s.prompt_tokens, flush=True)
    w.grab().save("/tmp/speclens-real_done.png")
    if os.environ.get("CRASH"):
        w.controls.temp_slider.setValue(0)
        w.input.setPlainText("And a version with memoization, please.")
        w.send()
        record = controller.active.record
        wait_until(lambda: len(record.rounds) >= 6)
        os.kill(controller.host.pid, signal.SIGKILL)
        wait_until(lambda: w.banner.isVisible() and idle())
        wait(400)
        qa.primaryScreen().grabWindow(0).save(os.environ["CRASH"])
        print("crash shot taken:", w.banner.label.text(), flush=True)
    w.close()
    controller.shutdown()
    return 0


if __name__ == "__main__":  # the engine process is spawned: it must not run this again
    sys.exit(main())
