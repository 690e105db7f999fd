"""Step-through mid-round and the K tuner's chart, in the real window under Xvfb (how docs/images/step_through.png and
docs/images/tuner.png were made).

    Xvfb :99 -screen 0 1480x900x24 &
    export DISPLAY=:99 STEP=docs/images/step_through.png TUNER=docs/images/tuner.png
    python -m scripts.screenshots.step_tuner light

One reply of the embedded pair at temperature 0.7 with the draft model and Run > Step through on: Next (F10) is
pressed until a round is decided with a rejected draft (round 3 or later), and the screen is grabbed there. Then
Continue (F5) finishes the reply, Run > Tune K replays it (N_TUNE new tokens each), and the dialog is grabbed when
the sweep is done. MODELS=tiny runs the tiny random pair of tests/tiny.py instead.
"""
import functools
import os
import sys
import time

from scripts.screenshots import xvfb_window


def main() -> int:
    qa, controller, w = xvfb_window.open_window({"draft_name": "tiny-draft"})
    wait = xvfb_window.wait
    wait_until = functools.partial(xvfb_window.wait_until, timeout=1200)
    idle = functools.partial(xvfb_window.idle, controller, w)
    from engine.api.events import Phase

    if not xvfb_window.load_pair(controller, w, timeout=1200, scan=False):
        return 1
    w.controls.max_tokens_spin.setValue(int(os.environ.get("N1", "48")))
    w.controls.k_slider.setValue(int(os.environ.get("K", "4")))
    w.controls.temp_slider.setValue(int(os.environ.get("T", "70")))
    w.controls.seed_spin.setValue(int(os.environ.get("SEED", "7")))
    w.stepper.toggle_action.setChecked(True)
    w.input.setPlainText(os.environ.get("P1", "Write a Python function that checks whether a string is a "
                                              "palindrome, ignoring case and spaces."))
    w.send()

    def paused():
        return controller.paused is not None or not controller.busy

    def wanted(ev):
        return (ev.phase == Phase.DECIDED and ev.round >= int(os.environ.get("MIN_ROUND", "3"))
                and ev.tokens and ev.accepted is not None and ev.accepted < len(ev.tokens))

    while True:
        wait_until(paused)
        ev = controller.paused
        if ev is None:
            print("the reply ended before a wanted phase", flush=True)
            return 1
        if wanted(ev):
            break
        w.stepper.next_action.trigger()  # F10 (no window manager under Xvfb: no focus for keys)
        wait_until(lambda: controller.paused is not ev)
    wait(1500)  # paused: the charts catch up
    qa.primaryScreen().grabWindow(0).save(os.environ.get("STEP", "/tmp/speclens-step.png"))
    print("step shot:", ev.round, ev.phase.value, ev.accepted, "of", len(ev.tokens), flush=True)
    w.stepper.continue_action.trigger()  # F5
    wait_until(idle)
    w.stepper.toggle_action.setChecked(False)
    s = controller.stats.records[-1].summary
    print("reply", s.new_tokens, "tok", f"acc {s.acceptance_rate:.2f}", flush=True)

    w.controls.max_tokens_spin.setValue(int(os.environ.get("N_TUNE", "32")))
    controller.last_request = (controller.last_request[0],
                               controller.last_request[1].with_(max_new_tokens=int(os.environ.get("N_TUNE", "32"))),
                               controller.last_request[2])
    t0 = time.time()
    dlg = w.tune_k()
    dlg.resize(860, 600)
    wait_until(lambda: dlg.tuner.done, timeout=3600)
    wait(500)
    dlg.grab().save(os.environ.get("TUNER", "/tmp/speclens-tuner.png"))
    print("tuner", f"{time.time() - t0:.0f}s", dlg.result.text(), flush=True)
    for r in dlg.sweep.runs:
        print(f"  {r.label:<18} {r.tokens_per_s:6.2f} tok/s  speedup {dlg.sweep.speedup(r) or 0:.2f}  "
              f"accepted {r.accepted}/{r.drafted}", flush=True)
    dlg.close()
    w.close()
    controller.shutdown()
    return 0


if __name__ == "__main__":  # the engine process is spawned: it must not run this again
    sys.exit(main())
