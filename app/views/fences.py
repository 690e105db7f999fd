"""Code fences in streamed text: which characters of a reply are inside ``` blocks, as they arrive."""
from __future__ import annotations


class FenceTracker:
    """Follows ``` fences through streamed text. `feed` splits text into ("text", segment, mono),
    ("newline",) and ("open",) / ("close",) steps; mono is True inside a fence (and for backticks)."""

    def __init__(self) -> None:
        self.in_code = False
        self._ticks = 0

    def feed(self, text: str) -> list[tuple]:
        out: list[tuple] = []
        buf: list[str] = []
        mono = self.in_code

        def flush() -> None:
            if buf:
                out.append(("text", "".join(buf), mono))
                buf.clear()

        for ch in text:
            if ch == "\n":
                flush()
                out.append(("newline",))
                self._ticks = 0
                continue
            want = self.in_code or ch == "`"
            if want != mono:
                flush()
                mono = want
            buf.append(ch)
            if ch == "`":
                self._ticks += 1
                if self._ticks == 3:
                    self._ticks = 0
                    self.in_code = not self.in_code
                    flush()
                    out.append(("open",) if self.in_code else ("close",))
            else:
                self._ticks = 0
        flush()
        return out
