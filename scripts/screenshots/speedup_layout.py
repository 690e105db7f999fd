"""The chart's speedup beside Compare's on the same prompt, and the window with the inspector and step-through open on
a 1280x800 screen (how docs/images/speedup-vs-compare.png and docs/images/layout-1280x800.png were made).

    Xvfb :99 -screen 0 1280x800x24 &
    DISPLAY=:99 python -m scripts.screenshots.speedup_layout light

One greedy reply of the embedded pair in the app's default mode (N new tokens, 256 unless set), then Run > Compare on
the same prompt. It prints the chart's speedup (this reply's speculative rounds against the plain steps timed in it,
both in wall time, app.controller.PLAIN_EVERY) beside Compare's paired A/B and their ratio, and grabs the screen with
both in view. HOG=1 runs a busy process during the reply and both of Compare's halves, as a load. STATS=path writes
every round of the reply and of Compare's replays (the CSV export), to see where the two differ. Then
step-through is turned on, a token is clicked for the inspector, a second prompt is sent, and the screen is grabbed at
the first decided round from round 3 on that drafted. A measurement, not a test: on a shared 2-core machine both figures move with
the neighbours' load.
"""
import functools
import os
import subprocess
import sys

from scripts.screenshots import xvfb_window

PROMPT = ("Write a Python function that merges two sorted lists into one sorted list, with a docstring and a short "
          "example.")
PROMPT2 = "Now write the same function in JavaScript."
HOG = "import time\nwhile True:\n    sum(i * i for i in range(10000))\n"


def main() -> int:
    qa, controller, w = xvfb_window.open_window()
    wait = xvfb_window.wait
    wait_until = functools.partial(xvfb_window.wait_until, timeout=float(os.environ.get("TIMEOUT", "1800")))
    idle = functools.partial(xvfb_window.idle, controller, w)
    from engine.api.events import Phase

    if not xvfb_window.load_pair(controller, w, timeout=1200):
        return 1
    screen = qa.primaryScreen().availableGeometry()
    print("screen", screen.width(), "x", screen.height(), "window", w.frameGeometry().getRect(), flush=True)
    w.controls.max_tokens_spin.setValue(int(os.environ.get("N", "256")))
    w.controls.temp_slider.setValue(0)
    hog = subprocess.Popen([sys.executable, "-c", HOG]) if os.environ.get("HOG") else None
    try:
        w.input.setPlainText(PROMPT)
        w.send()
        wait_until(idle)
        b = w.charts.buffer
        chart, theory, r = b.reply.measured_speedup(), b.theory_now(), b.reply
        dlg = w.compare()
        # At the top of the screen: the charts' column, scrolled down to the speedup plot, stays in view under it
        dlg.resize(720, 370)
        dlg.move(screen.x(), screen.y())
        w.charts.scroll.verticalScrollBar().setValue(w.charts.scroll.verticalScrollBar().maximum())
        wait_until(lambda: not dlg.running)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
        if os.environ.get("STATS"):  # every round of the reply and of both replays, to see where the two differ
            print("rounds written to", *controller.stats.write_csv(os.environ["STATS"]), flush=True)
    wait(1500)
    v = dlg.verdict
    text = "\u2014" if chart is None else f"{chart:.2f}x"
    print(f"chart: speedup {text} vs plain measured this reply ({r.plain_wall.rounds} plain steps), theory "
          f"{theory or 0:.2f}x; speculative {r.spec_wall.tokens_per_s or 0:.2f} tok/s, plain "
          f"{r.plain_wall.tokens_per_s or 0:.2f} tok/s (wall time)", flush=True)
    if v is not None:
        print(f"compare: {v.text}", flush=True)
        if chart is not None and v.speedup > 0:
            print(f"chart / compare = {chart / v.speedup:.3f}", flush=True)
    qa.primaryScreen().grabWindow(0).save(os.environ.get("SHOT1", "docs/images/speedup-vs-compare.png"))
    dlg.close()
    wait(300)

    w.stepper.toggle_action.setChecked(True)
    w.inspector.show_token(w.chat.infos[min(12, len(w.chat.infos) - 1)])
    w.controls.max_tokens_spin.setValue(64)
    w.input.setPlainText(PROMPT2)
    w.send()

    def wanted(ev):
        return ev.phase == Phase.DECIDED and ev.round >= 3 and bool(ev.tokens)

    while True:
        wait_until(lambda: controller.paused is not None or not controller.busy)
        ev = controller.paused
        if ev is None:
            print("the reply ended before a decided round that drafted", flush=True)
            break
        if wanted(ev):
            break
        w.stepper.next_action.trigger()
        wait_until(lambda ev=ev: controller.paused is not ev)
    wait(1500)
    print("window", w.frameGeometry().getRect(), "inside the screen:", screen.contains(w.frameGeometry()),
          flush=True)
    qa.primaryScreen().grabWindow(0).save(os.environ.get("SHOT2", "docs/images/layout-1280x800.png"))
    w.stepper.continue_action.trigger()
    wait_until(lambda: not controller.busy, timeout=600)
    w.close()
    controller.shutdown()
    return 0


if __name__ == "__main__":  # the engine process is spawned: it must not run this again
    sys.exit(main())
