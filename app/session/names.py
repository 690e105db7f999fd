"""What the user reads for the engine's drafter names (engine.api.config.Drafter, RoundEvent.drafter)."""
from __future__ import annotations

DRAFTER_NAMES = {"model": "draft model", "ngram": "n-gram", "hybrid": "draft model + n-gram"}


def drafter_name(drafter: str | None) -> str:
    return DRAFTER_NAMES.get(drafter, drafter) if drafter else "plain decoding"
