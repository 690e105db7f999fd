"""Compare's verdict on a plain and a speculative reply of the same prompt: both rates, the speedup, and whether
the outputs are identical, as they must be under greedy decoding (speculative decoding is lossless). No Qt here."""
from __future__ import annotations

from dataclasses import dataclass

from engine.api.events import Summary


@dataclass(frozen=True)
class Verdict:
    plain_tps: float
    spec_tps: float
    speedup: float
    identical: bool
    greedy: bool

    @property
    def text(self) -> str:
        same = "identical" if self.identical else "different"
        return (f"Plain {self.plain_tps:.1f} tok/s \u00b7 speculative {self.spec_tps:.1f} tok/s \u00b7 "
                f"speedup {self.speedup:.2f}\u00d7 \u00b7 outputs {same}")

    @property
    def note(self) -> str:
        if self.greedy:
            return ("Greedy decoding: identical outputs are guaranteed, as expected." if self.identical else
                    "Greedy decoding, yet the outputs differ: this should not happen. Please report it.")
        return ("Sampling at temperature > 0: speculative sampling keeps the target's distribution, so the "
                "two replies may differ even with the same seed.")

    @property
    def ok(self) -> bool:
        return self.identical or not self.greedy


def compare(plain: Summary, spec: Summary, greedy: bool) -> Verdict:
    same = plain.token_ids == spec.token_ids if plain.token_ids or spec.token_ids else plain.text == spec.text
    speedup = spec.tokens_per_s / plain.tokens_per_s if plain.tokens_per_s > 0 else 0.0
    return Verdict(plain.tokens_per_s, spec.tokens_per_s, speedup, same, greedy)
