"""The charts across a speculation-off reply, in the real window under Xvfb (how docs/images/charts-after-plain.png was
made).

    Xvfb :99 -screen 0 1480x900x24 &
    DISPLAY=:99 SHOT=docs/images/charts-after-plain.png python -m scripts.screenshots.plain_gap light

Three greedy replies of the embedded pair: speculative (draft model, K 4), plain (speculation off), speculative
again; then the screen is grabbed. The acceptance line and its mean must break over the plain rounds rather than
run across them: the third reply is there so that there is a line on both sides of the gap.
MODELS=tiny runs the tiny random pair of tests/tiny.py instead.
"""
import functools
import os
import sys

from scripts.screenshots import xvfb_window

PROMPTS = ["Write a Python function that reverses a string, with a docstring.",
           "Now a short paragraph on why slicing is fast in Python.",
           "And the same function in JavaScript."]


def main() -> int:
    qa, controller, w = xvfb_window.open_window()
    wait_until = functools.partial(xvfb_window.wait_until, timeout=900)
    idle = functools.partial(xvfb_window.idle, controller, w)

    if not xvfb_window.load_pair(controller, w):
        return 1
    w.controls.temp_slider.setValue(0)
    w.controls.k_slider.setValue(4)
    w.controls.max_tokens_spin.setValue(int(os.environ.get("N", "40")))
    for turn, prompt in enumerate(PROMPTS):
        w.controls.spec_toggle.setChecked(turn != 1)  # the middle reply plain
        w.input.setPlainText(prompt)
        w.send()
        record = controller.active.record
        wait_until(idle)
        modes = sorted({r.mode for r in record.rounds})
        print(f"turn {turn + 1}: {len(record.rounds)} rounds, modes {modes}", flush=True)
    xvfb_window.wait(400)
    qa.primaryScreen().grabWindow(0).save(os.environ.get("SHOT", "/tmp/speclens-plain-gap.png"))
    print("shot taken", flush=True)
    w.close()
    controller.shutdown()
    return 0


if __name__ == "__main__":  # the engine process is spawned: it must not run this again
    sys.exit(main())
