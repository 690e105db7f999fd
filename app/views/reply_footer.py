"""A finished reply's meta line (tokens, rounds, rate, acceptance, prompt reuse): in the chat and in traces."""
from __future__ import annotations

from engine.api.events import Summary


def reply_footer(s: Summary) -> str:
    parts = [f"{s.new_tokens} tokens in {s.rounds} rounds", f"{s.tokens_per_s:.1f} tok/s",
             f"{s.mean_tokens_per_round:.2f} tokens/round"]
    if s.drafted:
        parts.append(f"acceptance {s.acceptance_rate:.0%}")
    parts.append(f"reused {s.reused_prefix_tokens} of {s.prompt_tokens} prompt tokens")
    if s.stop_reason not in ("eos", "stop"):
        parts.append({"cancelled": "stopped", "length": "hit the token limit"}.get(s.stop_reason, s.stop_reason))
    return "  \u00b7  ".join(parts)
