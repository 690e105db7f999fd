"""Stop while a ~20,000-token prompt is being read: how docs/images/reading-prompt.png was made, and how long Stop
takes there.

    Xvfb :97 -screen 0 1280x800x24 &
    DISPLAY=:97 python -m scripts.screenshots.long_prompt_stop light

The real window on the embedded pair, its Context raised so the prompt fits (TOKENS=20000 by default, the Context
setting to the next 1024 above it plus the reply's length). The prompt is the repository's own docs, repeated until
it is long enough, pasted into the message box from the clipboard and sent. Once the status line has shown "Reading
the prompt… N of M" for a few chunks the screen is grabbed, then Stop is clicked. It prints the prompt's length in
tokens, the chunk (the difference between two readings of the progress), the seconds each chunk took, and the
seconds from the click to "Stopping…" showing and to the request's end, and the reply's footer. A measurement, not a
test: on a shared machine the seconds move with the neighbours' load.
"""
import functools
import itertools
import os
import sys
import time
from pathlib import Path

from scripts.screenshots import xvfb_window

CHARS_PER_TOKEN = 3.77  # the Qwen tokenizer on these docs: 72,000 characters made 19,096 tokens (printed each run)
CHUNKS_BEFORE_SHOT = 3  # readings of the progress seen before the screenshot and the click
REPLY_TOKENS = 256


def docs_text(chars: int) -> str:
    """Real text, the repository's README and docs pages in turn, repeated to `chars` characters."""
    root = Path(__file__).resolve().parents[2]
    pages = [root / "README.md", *sorted((root / "docs").glob("*.md"))]
    text = "\n\n".join(p.read_text(encoding="utf-8") for p in pages)
    out = "Summarise the following documentation in five bullet points.\n\n"
    while len(out) < chars:
        out += text[: chars - len(out)] + "\n\n"
    return out


def main() -> int:
    qa, controller, w = xvfb_window.open_window()
    wait = xvfb_window.wait
    wait_until = functools.partial(xvfb_window.wait_until, timeout=1800)
    tokens = int(os.environ.get("TOKENS", "20000"))
    context = (tokens + REPLY_TOKENS + 1023) // 1024 * 1024 + 1024
    w.controls.context.set_wanted(context)  # the side panel's Context: the default 4096 would refuse the prompt
    if not xvfb_window.load_pair(controller, w, timeout=1200):
        return 1
    print("context", controller.info.context, flush=True)
    w.controls.max_tokens_spin.setValue(REPLY_TOKENS)
    qa.clipboard().setText(docs_text(int(tokens * CHARS_PER_TOKEN)))
    w.input.setFocus()
    w.input.paste()
    w.send()
    if not controller.busy:
        print("not sent:", w.statusBar().currentMessage(), flush=True)
        return 1

    seen: list[tuple[float, int, int]] = []  # (seconds, tokens read, of) at each new reading of the target's

    def progress() -> bool:
        p = w.prefill
        if p is not None and p.model == "target" and (not seen or seen[-1][1] != p.done):
            seen.append((time.perf_counter(), p.done, p.total))
        return len(seen) > CHUNKS_BEFORE_SHOT or not controller.busy

    wait_until(progress)
    if not controller.busy:
        print("the request ended before its prompt was read in chunks", flush=True)
        return 1
    label = w.round_label.text()
    print("status:", label, flush=True)
    steps = {b[1] - a[1] for a, b in itertools.pairwise(seen[1:])}  # the first reading may follow a reused prefix
    per_chunk = [(b[0] - a[0]) for a, b in itertools.pairwise(seen[1:])]
    print(f"prompt {seen[-1][2]:,} tokens; chunk {sorted(steps)} tokens; seconds a chunk "
          f"{', '.join(f'{s:.2f}' for s in per_chunk)}", flush=True)
    wait(200)  # the status line painted
    qa.primaryScreen().grabWindow(0).save(os.environ.get("SHOT", "docs/images/reading-prompt.png"))

    click = time.perf_counter()
    w.stop_button.click()
    shown = None
    while controller.busy:
        if shown is None and w.round_label.text() == "Stopping\u2026":
            shown = time.perf_counter() - click
        wait(5)
    ended = time.perf_counter() - click
    p = w.prefill
    print(f"Stop: 'Stopping\u2026' showed {shown if shown is not None else float('nan'):.3f} s after the click, "
          f"the request ended {ended:.2f} s after it, {p.done:,} of {p.total:,} tokens read", flush=True)
    wait(500)
    footer = w.chat.toPlainText().strip().splitlines()[-1:]
    print("footer:", *footer, flush=True)
    w.close()
    controller.shutdown()
    return 0


if __name__ == "__main__":  # the engine process is spawned: it must not run this again
    sys.exit(main())
