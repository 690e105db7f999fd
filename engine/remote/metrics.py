"""Speculation counters from a server's Prometheus `/metrics` text.

llama-server (started with `--metrics`): llamacpp:spec_decode_num_drafts_total, _num_draft_tokens_total,
_num_accepted_tokens_total and _num_accepted_tokens_per_pos_total{position="i"}.
vLLM (its documented names, `vllm:spec_decode_*`; counters may carry a `_total` suffix and labels such as
model_name and engine): num_drafts, num_draft_tokens, num_accepted_tokens, num_accepted_tokens_per_pos{position="i"}.
Samples of one counter with different labels (several engines, several models) are summed.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)')
_POSITION = re.compile(r'position="(\d{1,6})"')
# A counter past this is not a count of tokens (2**53: where a float stops holding every whole number); NaN, Inf,
# negative and fractional samples are not counts either. Such a sample is skipped as a line that says nothing.
MAX_COUNT = 2**53
MAX_POSITION = 1024  # draft positions; servers draft at most a few dozen
PREFIXES = {"llama.cpp": "llamacpp:spec_decode_", "vllm": "vllm:spec_decode_"}


@dataclass(frozen=True)
class SpecCounters:
    """A server's speculation counters since it started (all requests, all slots)."""

    drafts: int  # rounds that drafted
    draft_tokens: int
    accepted_tokens: int
    accepted_per_pos: dict[int, int] = field(default_factory=dict)  # position (0-based) -> rounds it was accepted in

    def minus(self, before: SpecCounters) -> SpecCounters:
        """What happened between two readings."""
        keys = set(self.accepted_per_pos) | set(before.accepted_per_pos)
        return SpecCounters(self.drafts - before.drafts, self.draft_tokens - before.draft_tokens,
                            self.accepted_tokens - before.accepted_tokens,
                            {k: self.accepted_per_pos.get(k, 0) - before.accepted_per_pos.get(k, 0)
                             for k in sorted(keys)})


def parse(text: str, kind: str) -> SpecCounters | None:
    """The speculation counters in a /metrics text (None when it has none: no draft configured, or not a server
    of this kind)."""
    prefix = PREFIXES.get(kind)
    if prefix is None:
        return None
    sums: dict[str, int] = {}
    per_pos: dict[int, int] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if m is None or not m.group(1).startswith(prefix):
            continue
        name = m.group(1)[len(prefix):].removesuffix("_total")
        value = _count(m.group(3))
        if value is None:
            continue
        if name == "num_accepted_tokens_per_pos":
            pos = _POSITION.search(m.group(2) or "")
            if pos is not None and int(pos.group(1)) < MAX_POSITION:
                per_pos[int(pos.group(1))] = min(per_pos.get(int(pos.group(1)), 0) + value, MAX_COUNT)
            continue
        sums[name] = min(sums.get(name, 0) + value, MAX_COUNT)
    if not sums:
        return None
    return SpecCounters(sums.get("num_drafts", 0), sums.get("num_draft_tokens", 0),
                        sums.get("num_accepted_tokens", 0), dict(sorted(per_pos.items())))


def _count(text: str) -> int | None:
    """A sample's value as a count, or None for one that is not (NaN, +Inf, negative, fractional, huge)."""
    try:
        value = float(text)
    except ValueError:
        return None
    if not math.isfinite(value) or value < 0 or value > MAX_COUNT or value != int(value):
        return None
    return int(value)
