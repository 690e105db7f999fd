"""Draft-and-verify rounds rebuilt from what a server's stream reveals, as the app's RoundEvents and Summary.

llama-server (`"timings_per_token": true`): every chunk's `timings` carries the request's cumulative `draft_n`,
`draft_n_accepted` and `predicted_n`. The server updates the counters when it verifies a round, before it sends
that round's tokens, so the counters change at the first token of each round: a change of (Δdraft_n,
Δdraft_n_accepted) = (d, a) opens a round whose next a + 1 tokens are its a accepted drafts and the target's own
token (a correction when a < d, a bonus when a = d). Tokens that arrive while no round is open are plain target
steps (the first token, sampled by the prompt's pass, and any step where the server did not draft).
`predicted_n` counts tokens, so a chunk that carries several tokens (text held back for an incomplete UTF-8
character or a possible stop string) is split correctly; its text goes to its last token. Two rounds whose
tokens all arrive in one chunk show as one round with their summed counts: the totals stay exact.

vLLM (`"stream_options": {"include_usage": true, "continuous_usage_stats": true}`): its OpenAI server sends the
tokens of one engine step in one chunk, and the usage's cumulative `completion_tokens` says how many: a step of
n tokens is one round of n - 1 accepted drafts and the target's token. The stream does not say how many were
drafted; with K known (the server's num_speculative_tokens), a step of n = K + 1 is a bonus and a shorter one
ends with a correction.

What neither stream reveals stays unknown, never guessed: token ids (-1), p and q (NaN), rejected drafts' text
(""), and the split of a round's time between drafting and verifying (the whole round is `verify_ms`).
"""
from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.api.config import K_LIMIT
from engine.api.events import CommittedToken, DraftToken, Origin, RoundEvent, Summary
from engine.remote.errors import RemoteError

UNKNOWN = math.nan  # p and q: a server does not send them
NO_ID = -1  # token ids: not in a chat stream
MAX_COUNT = 2**53  # a counter past this is no count (a float stops holding every whole number)
# Text a reply may carry per token asked for: far more than any vocabulary's longest token, small enough that a
# server streaming without end cannot fill memory before the token count or the deadline stops it.
CHARS_PER_TOKEN = 1024


class ReplyCut(Exception):
    """The stream must stop here: the server sent more than was asked. str(e) is the stop reason, for the user;
    what arrived before it stays."""


@dataclass
class _Open:
    """A round whose counters arrived and whose tokens are still arriving."""

    drafted: int
    accepted: int
    texts: list[str] = field(default_factory=list)
    counted: bool = True  # False: how many were drafted is unknown (vLLM before its K is known)

    @property
    def expected(self) -> int:
        return self.accepted + 1


class RoundBuilder:
    """Feed it the stream's parsed chunks in order; it returns each round as soon as its last token arrived."""

    def __init__(self, temperature: float, k: int | None, speculative: bool, *, stop_strings: bool = False,
                 clock: Callable[[], float] = time.perf_counter, max_tokens: int | None = None) -> None:
        """k: the server's draft limit when known (each round's K), else the most any round of this reply drafted.
        speculative: the server drafts (mode "speculative"); False for a plain server (mode "plain").
        max_tokens: what the request asked for; a server that claims more is cut off there (ReplyCut), and its
        counters are held to it: a round drafts at most K (K_LIMIT when unknown) per token it yields."""
        if k is not None and not 1 <= k <= K_LIMIT:  # a server's claim past any real K is no K
            k = None
        self.temperature, self.k, self.speculative = temperature, k, speculative
        self.max_tokens = max_tokens
        self.max_chars = None if max_tokens is None else 4096 + CHARS_PER_TOKEN * max_tokens
        self.sent_chars = 0  # text the rounds so far carried
        self.stop_strings = stop_strings
        self.clock = clock
        self.started = clock()
        self.first_token_s: float | None = None
        self.rounds: list[RoundEvent] = []
        self.open: _Open | None = None
        self.pending_text = ""  # text that came before the token it belongs to (none seen so far)
        self.n = 0  # tokens so far
        self.ms = 0.0  # the server's predicted_ms so far
        self.round_start_ms = 0.0  # predicted_ms when the last round closed
        self.draft_n = self.accepted_n = 0
        self.timings: dict[str, Any] = {}
        self.finish_reason: str | None = None
        self.most_drafted = 0  # K as far as this reply shows it, where the server does not say

    # ---- llama.cpp ---------------------------------------------------------------------------------------------
    def feed(self, chunk: dict[str, Any]) -> list[RoundEvent]:
        """One llama-server chunk; the rounds it completed."""
        text, reason = _delta(chunk)
        self.finish_reason = reason or self.finish_reason
        t = chunk.get("timings")
        if not isinstance(t, dict) or "predicted_n" not in t:
            self._hold(text)  # a role chunk, or a server that sends no timings with this one
            return []
        n, ms = _int(t, "predicted_n"), _num(t, "predicted_ms")
        d, a = _int(t, "draft_n", 0), _int(t, "draft_n_accepted", 0)
        if n < self.n or d < self.draft_n or a < self.accepted_n or (a - self.accepted_n) > (d - self.draft_n):
            raise RemoteError(f"the server's counters went wrong mid-reply (tokens {self.n} -> {n}, drafted "
                              f"{self.draft_n} -> {d}, accepted {self.accepted_n} -> {a})")
        self._check_count(n)
        # every round yields a token, and one may be open whose tokens are still to come
        if d - self.draft_n > (self.k or K_LIMIT) * (n - self.n + 1):
            raise RemoteError(f"the server's counters went wrong mid-reply: {d - self.draft_n} drafts for "
                              f"{n - self.n} tokens, more than K = {self.k or K_LIMIT} per round")
        self.timings, self.ms = t, ms
        out: list[RoundEvent] = []
        if d != self.draft_n:
            if self.open is not None:  # its tokens never all came (should not happen mid-stream): close it short
                out.append(self._close(None))
            self.open = _Open(d - self.draft_n, a - self.accepted_n)
            self.draft_n, self.accepted_n = d, a
        new = n - self.n
        self.n = n
        if new == 0:
            self._hold(text)
            return out
        texts = [""] * (new - 1) + [self.pending_text + text]
        self.pending_text = ""
        for piece in texts:
            out.extend(self._token(piece))
        return out

    def _token(self, text: str) -> list[RoundEvent]:
        if self.first_token_s is None:
            self.first_token_s = self.clock() - self.started
        if self.open is None:
            return [self._plain(text)]
        self.open.texts.append(text)
        return [self._close(None)] if len(self.open.texts) == self.open.expected else []

    def _plain(self, text: str, stop_reason: str | None = None) -> RoundEvent:
        if not self.rounds:  # the prompt's pass sampled it: its time is the Summary's prefill_s, not a decode step's
            self.round_start_ms = self.ms
        tok = CommittedToken(NO_ID, text, Origin.PLAIN, 0, UNKNOWN)
        mode = "speculative" if self.speculative else "plain"
        return self._event(mode, None, 0, (), (tok,), stop_reason)

    def _close(self, stop_reason: str | None) -> RoundEvent:
        o, self.open = self.open, None
        assert o is not None
        drafted = tuple(DraftToken(NO_ID, o.texts[i] if i < o.accepted and i < len(o.texts) else "", UNKNOWN,
                                   UNKNOWN, i < o.accepted) for i in range(o.drafted if o.counted else 0))
        committed = [CommittedToken(NO_ID, t, Origin.ACCEPTED, i, UNKNOWN, UNKNOWN)
                     for i, t in enumerate(o.texts[: o.accepted])]
        if len(o.texts) > o.accepted:
            final = (Origin.PLAIN if not o.counted else  # the target's token; correction or bonus is unknown
                     Origin.BONUS if o.accepted == o.drafted else Origin.CORRECTED)
            committed.append(CommittedToken(NO_ID, o.texts[o.accepted], final, o.accepted, UNKNOWN))
        self.most_drafted = max(self.most_drafted, o.drafted)
        return self._event("speculative", "model", self.k or self.most_drafted, drafted, tuple(committed),
                           stop_reason)

    def _event(self, mode: str, drafter: str | None, k: int, drafted: tuple[DraftToken, ...],
               committed: tuple[CommittedToken, ...], stop_reason: str | None) -> RoundEvent:
        ms, self.round_start_ms = self.ms - self.round_start_ms, self.ms
        new_tokens = sum(len(r.committed) for r in self.rounds) + len(committed)
        ev = RoundEvent(len(self.rounds) + 1, mode, drafter, k, self.temperature, drafted, committed,
                        "".join(c.text for c in committed), 0.0, max(ms, 0.0), self.clock() - self.started,
                        new_tokens, stop_reason)
        self.rounds.append(ev)
        self.sent_chars += len(ev.text_delta)
        return ev

    # ---- vLLM --------------------------------------------------------------------------------------------------
    def feed_step(self, chunk: dict[str, Any]) -> list[RoundEvent]:
        """One vLLM chunk (continuous usage stats on): its tokens are one engine step, one round."""
        text, reason = _delta(chunk)
        self.finish_reason = reason or self.finish_reason
        usage = chunk.get("usage")
        if not isinstance(usage, dict) or "completion_tokens" not in usage:
            self._hold(text)
            return []
        n = _int(usage, "completion_tokens")
        if n < self.n:
            raise RemoteError(f"the server's token count went backwards mid-reply ({self.n} -> {n})")
        self._check_count(n)
        self.timings = {"prompt_n": _int(usage, "prompt_tokens", 0)}
        new, self.n = n - self.n, n
        self.ms = (self.clock() - self.started) * 1000.0  # vLLM sends no per-token timings: the client's clock
        if new == 0:
            self._hold(text)
            return []
        if self.first_token_s is None:
            self.first_token_s = self.clock() - self.started
            if new == 1:  # the prompt's pass samples the first token alone
                out = [self._plain(self.pending_text + text)]
                self.pending_text = ""
                return out
        accepted = new - 1
        # K unknown (no /metrics, nothing drafted yet): the accepted drafts are coloured, but nothing is counted as
        # drafted or accepted (an acceptance of 100% would be made up), and the last token is the target's
        drafted = max(self.k or accepted, accepted)
        self.open = _Open(drafted, accepted, [""] * (new - 1) + [self.pending_text + text], counted=bool(self.k))
        self.pending_text = ""
        self.draft_n, self.accepted_n = self.draft_n + drafted, self.accepted_n + accepted
        return [self._close(None)]

    # ---- bounds ------------------------------------------------------------------------------------------------
    def _check_count(self, n: int) -> None:
        """A reply holds no more tokens than asked: a server that claims more ignores max_tokens (or lies)."""
        if self.max_tokens is not None and n > self.max_tokens:
            raise ReplyCut(f"cut off: the server sent more than the {self.max_tokens} tokens asked for")

    def _hold(self, text: str) -> None:
        """Text whose token is still to come, bounded: a server that streams text without counting it (or
        without end) is cut off once it sent more than the asked tokens could hold."""
        self.pending_text += text
        if self.max_chars is not None and self.sent_chars + len(self.pending_text) > self.max_chars:
            self.pending_text = self.pending_text[: max(0, self.max_chars - self.sent_chars)]
            raise ReplyCut(f"cut off: the server sent more text than {self.max_tokens} tokens can hold")

    # ---- the end -----------------------------------------------------------------------------------------------
    def finish(self, cancelled: bool = False, cut: str | None = None) -> tuple[list[RoundEvent], Summary]:
        """The stream ended (or was cancelled): the round it cut short, if any, and the request's Summary.
        cut: why the stream ended before the server said the reply was complete (its stop reason)."""
        stop = "cancelled" if cancelled else cut or _stop_reason(self.finish_reason, self.stop_strings)
        out: list[RoundEvent] = []
        if self.open is not None and self.open.texts:  # a reply that ended mid-round (EOS among the accepted)
            out.append(self._close(stop))
        self.open = None  # else the last round already went out: its stop reason rides on the Summary alone
        return out, self._summary(stop)

    def _summary(self, stop: str) -> Summary:
        rounds = self.rounds
        drafted = sum(len(r.drafted) for r in rounds)
        accepted = sum(r.accepted for r in rounds)
        positions = max((len(r.drafted) for r in rounds), default=0)
        tried = [sum(1 for r in rounds if len(r.drafted) > i) for i in range(positions)]
        kept = [sum(1 for r in rounds if len(r.drafted) > i and r.drafted[i].accepted) for i in range(positions)]
        t = self.timings
        total = self.clock() - self.started
        decode_ms = self.ms if "predicted_ms" in t else max(total - (self.first_token_s or 0.0), 0.0) * 1000
        decode_n = self.n if "predicted_ms" in t else max(self.n - 1, 0)
        return Summary(
            new_tokens=self.n, rounds=len(rounds), target_forwards=len(rounds), drafted=drafted, accepted=accepted,
            acceptance_rate=accepted / drafted if drafted else 0.0,
            mean_tokens_per_round=self.n / len(rounds) if rounds else 0.0,
            per_position_acceptance=tuple(k / n for k, n in zip(kept, tried)),
            tokens_per_s=decode_n / decode_ms * 1000.0 if decode_ms > 0 else 0.0,
            ttft_s=self.first_token_s or 0.0, total_s=total,
            prompt_tokens=_int(t, "prompt_n", 0) + _int(t, "cache_n", 0), reused_prefix_tokens=_int(t, "cache_n", 0),
            draft_ms=0.0, verify_ms=self.ms, stop_reason=stop,
            text="".join(r.text_delta for r in rounds) + self.pending_text, token_ids=(),
            prefill_s=_num(t, "prompt_ms", 0.0) / 1000.0, text_tail=self.pending_text)


def _delta(chunk: dict[str, Any]) -> tuple[str, str | None]:
    """The chunk's text and finish reason (a chunk with no choices, e.g. a usage chunk, has neither)."""
    choices = chunk.get("choices")
    if not isinstance(choices, list) or not choices:
        return "", None
    first = choices[0]
    if not isinstance(first, dict):
        raise RemoteError(f"the server sent a chunk whose choice is not an object: {first!r:.80}")
    delta = first.get("delta") or {}
    text = delta.get("content") if isinstance(delta, dict) else None
    if text is not None and not isinstance(text, str):
        raise RemoteError(f"the server sent a chunk whose content is not text: {text!r:.80}")
    reason = first.get("finish_reason")
    return text or "", reason if isinstance(reason, str) else None


def _int(d: dict[str, Any], key: str, default: int | None = None) -> int:
    """A count the server sent: a whole number in [0, 2**53]. NaN and Inf are checked before int() sees them."""
    v = d.get(key, default)
    if (isinstance(v, bool) or not isinstance(v, (int, float)) or (isinstance(v, float) and not math.isfinite(v))
            or v != int(v) or not 0 <= v <= MAX_COUNT):
        raise RemoteError(f"the server sent {key} = {v!r:.40}, not a whole number in [0, 2**53]")
    return int(v)


def _num(d: dict[str, Any], key: str, default: float | None = None) -> float:
    v = d.get(key, default)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise RemoteError(f"the server sent {key} = {v!r}, not a number")
    return float(v)


def _stop_reason(finish_reason: str | None, stop_strings: bool) -> str:
    """OpenAI's finish reasons in the engine's words: "stop" is an end-of-sequence token unless stop strings were
    given (the server does not say which of the two it met)."""
    if finish_reason == "length":
        return "length"
    if finish_reason == "stop":
        return "stop" if stop_strings else "eos"
    return finish_reason or "eos"
