"""The commit phase: the round's decided tokens join the conversation one by one, each with its share of the text,
until one ends the reply (EOS, a stop string, the length budget or the context)."""
from __future__ import annotations

from engine.api.events import CommittedToken, Origin
from engine.runtime.detok import Detokenizer
from engine.runtime.stops import StopChecker
from engine.spec.accept import Verdict


class Transcript:
    def __init__(self, tokenizer, ids: list[int], stop: tuple[str, ...], eos_ids: set[int], max_new: int,
                 max_seq_len: int) -> None:
        """ids: the conversation, appended to in place; its length now is where the reply starts."""
        self.ids, self.eos_ids = ids, eos_ids
        self.prompt_len, self.max_new, self.max_seq_len = len(ids), max_new, max_seq_len
        self.detok = Detokenizer(tokenizer)
        self.stops = StopChecker(stop)

    @property
    def generated(self) -> int:
        return len(self.ids) - self.prompt_len

    def room(self) -> int:
        """Drafts a round may still propose: verify writes K+1 positions, and the reply has a length budget."""
        return min(self.max_seq_len - len(self.ids), self.max_new - self.generated - 1)

    def commit(self, tokens: list[int], origins: list[Origin], v: Verdict) -> tuple[list[CommittedToken], str | None]:
        """The committed tokens and the stop reason, if one of them ended the reply (anything after it is dropped)."""
        committed: list[CommittedToken] = []
        for i, tok in enumerate(tokens):
            piece, hit = self.stops.feed(self.detok.push(tok))
            self.ids.append(tok)
            stop = self._stop_reason(tok, hit)
            if stop and stop != "stop":
                piece += self.release()  # held back as a possible stop-string start
            drafted = i < v.accepted
            p = v.p_drafted[i] if drafted else v.p_next
            committed.append(CommittedToken(tok, piece, origins[i], i, p, v.q_drafted[i] if drafted else None))
            if stop:
                return committed, stop
        return committed, None

    def _stop_reason(self, token: int, hit_stop_string: bool) -> str | None:
        if token in self.eos_ids:
            return "eos"
        if hit_stop_string:
            return "stop"
        if self.generated >= self.max_new or len(self.ids) >= self.max_seq_len:
            return "length"
        return None

    def release(self) -> str:
        """At a non-stop ending: the text still held back (an unfinished character, a possible stop-string start)."""
        piece, hit = self.stops.feed(self.detok.flush())
        return piece if hit else piece + self.stops.flush()
