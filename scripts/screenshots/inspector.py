"""The distribution inspector open on a rejected draft, in the real window under Xvfb (how
docs/images/inspector.png was made), and the session saved as a trace.

    Xvfb :99 -screen 0 1480x900x24 &
    export DISPLAY=:99 SHOT=docs/images/inspector.png TRACE=docs/images/inspector-trace.json
    python -m scripts.screenshots.inspector light

One reply of the embedded pair at temperature 0.8 with the draft model; then a click on the first rejected draft
(a real mouse click on the chat) opens the inspector, and the screen is grabbed. MODELS=tiny runs the tiny random
pair of tests/tiny.py instead.
"""
import functools
import os
import sys

from scripts.screenshots import xvfb_window


def main() -> int:
    qa, controller, w = xvfb_window.open_window()
    wait = xvfb_window.wait
    wait_until = functools.partial(xvfb_window.wait_until, timeout=900)
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QTextCursor
    from PySide6.QtTest import QTest

    from app.views.tokens import REJECTED

    if not xvfb_window.load_pair(controller, w):
        return 1
    w.controls.max_tokens_spin.setValue(int(os.environ.get("N", "70")))
    w.controls.temp_slider.setValue(int(os.environ.get("T", "80")))
    w.controls.k_slider.setValue(int(os.environ.get("K", "3")))
    w.input.setPlainText(os.environ.get("PROMPT", "Explain in two sentences what a hash map is, then give a "
                                                  "one-line Python example."))
    w.send()
    wait_until(lambda: not controller.busy and not w.frame_timer.isActive())
    chat = w.chat
    doc = chat.document()
    pos = next((i for i in range(doc.characterCount() - 1)
                if (info := chat.token_info_at_position(i)) is not None and info.kind == REJECTED), None)
    if pos is None:
        print("no rejected draft in this reply; try another SEED or prompt", flush=True)
        return 1
    cursor = QTextCursor(doc)
    cursor.setPosition(pos)
    chat.setTextCursor(cursor)
    chat.ensureCursorVisible()
    point = chat.cursorRect(cursor).center()
    point.setX(point.x() + 3)
    QTest.mouseClick(chat.viewport(), Qt.MouseButton.LeftButton, pos=point)
    wait(500)
    info = w.inspector.panel.info
    print("inspecting", info and (info.kind, info.text, info.round, info.position), flush=True)
    qa.primaryScreen().grabWindow(0).save(os.environ.get("SHOT", "/tmp/speclens-inspector.png"))
    print("shot taken", flush=True)
    if os.environ.get("TRACE"):
        print("trace saved" if w.save_trace(os.environ["TRACE"]) else "trace NOT saved", flush=True)
    w.close()
    controller.shutdown()
    return 0


if __name__ == "__main__":  # the engine process is spawned: it must not run this again
    sys.exit(main())
