"""Stop strings, matched across token boundaries without ever emitting part of a stop string."""
from __future__ import annotations


class StopChecker:
    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = tuple(s for s in stops if s)
        self.pending = ""  # text held back because it could be the start of a stop string

    def feed(self, piece: str) -> tuple[str, bool]:
        """Returns (text safe to emit, whether a stop string was completed)."""
        if not self.stops:
            return piece, False
        buf = self.pending + piece
        hits = [i for i in (buf.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.pending = ""
            return buf[: min(hits)], True
        hold = max((n for s in self.stops for n in range(1, min(len(s), len(buf)) + 1) if buf.endswith(s[:n])), default=0)
        self.pending = buf[len(buf) - hold :]
        return buf[: len(buf) - hold], False

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out
