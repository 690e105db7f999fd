"""A finished reply's meta line (tokens, rounds, rate, acceptance, prompt reuse, how long the prompt took to read):
in the chat and in traces."""
from __future__ import annotations

from engine.api.events import PrefillProgress, Summary

NOTED_S = 2.0  # a prompt read faster than this is not worth a word in the footer


def duration(seconds: float) -> str:
    """'45 s', '4 min 45 s'."""
    s = round(seconds)
    return f"{s // 60} min {s % 60} s" if s >= 60 else f"{s} s"


def reading(p: PrefillProgress) -> str:
    """How far a prompt's prefill has come, for the status line: 'Reading the prompt… 8,192 of 27,000 tokens'."""
    who = "Reading the prompt" if p.model == "target" else "The draft model is reading the prompt"
    return f"{who}\u2026 {p.done:,} of {p.total:,} tokens"


def reply_footer(s: Summary, prefill: PrefillProgress | None = None) -> str:
    """prefill: the reply's last PrefillProgress, if any; a reply stopped before its prompt was read says how far
    the reading came."""
    parts = [f"{s.new_tokens} tokens in {s.rounds} rounds", f"{s.tokens_per_s:.1f} tok/s",
             f"{s.mean_tokens_per_round:.2f} tokens/round"]
    if s.drafted:
        parts.append(f"acceptance {s.acceptance_rate:.0%}")
    parts.append(f"reused {s.reused_prefix_tokens} of {s.prompt_tokens} prompt tokens")
    draft_s = s.draft_prefill_ms / 1e3
    if s.prefill_s >= NOTED_S or draft_s >= NOTED_S:  # the wait before the first token, where it was long
        read = [f"prompt read in {duration(s.prefill_s)}"] if s.prefill_s >= NOTED_S else []
        read += [f"by the draft model in {duration(draft_s)}"] if draft_s >= NOTED_S else []
        parts.append(", ".join(read))
    if prefill is not None and prefill.done < prefill.total and s.stop_reason == "cancelled":
        who = "the prompt" if prefill.model == "target" else "the prompt (draft model)"
        parts.append(f"stopped while reading {who}: {prefill.done:,} of {prefill.total:,} tokens read")
    elif s.stop_reason not in ("eos", "stop"):
        parts.append({"cancelled": "stopped", "length": "hit the token limit"}.get(s.stop_reason, s.stop_reason))
    return "  \u00b7  ".join(parts)
