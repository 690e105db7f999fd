"""What every drafter is: it proposes up to K tokens (and their q) after the committed ids, forgets what a round
rejected, and fits adaptive K to its own rounds."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from engine.api.config import SamplingParams, SpecParams
from engine.spec.adaptive import AdaptiveK


class DraftStopped(Exception):
    """A drafter's catch-up prefill was stopped between its chunks (a cancel): the round does not happen."""


@dataclass(frozen=True)
class Proposal:
    tokens: torch.Tensor  # (n,), n <= K; n == 0 means "nothing to propose: decode plainly"
    q: torch.Tensor  # (n, V)
    prefill_s: float = 0.0  # part of the propose() time spent catching the drafter's cache up (prompt prefill)
    logits: torch.Tensor | None = None  # (n, V) under greedy, where q is a point mass: what the inspector shows
    source: str | None = None  # the name of the drafter that made it, when that is not the one asked (hybrid)
    reason: str = ""  # why this drafter and K drafted the round (the hybrid's policy), for the round's record


@dataclass(frozen=True)
class Outcome:
    """How a drafter's round went, as the round loop measured it."""

    drafter: str  # the drafter that drafted (under the hybrid, the one it picked)
    drafted: int
    accepted: int
    draft_s: float  # drafting time, its cache's catch-up prefill left out
    verify_s: float
    learn_k: bool  # adaptive K is on: fit its model to this round


class Drafter(Protocol):
    name: str

    def configure(self, spec: SpecParams) -> None:
        """The round's speculation settings (the drafter's own stopping rule reads them)."""

    def start(self) -> None:
        """A new request: a fresh record."""

    def choose_k(self, spec: SpecParams) -> int:
        """How many tokens to draft this round, at most spec.k."""

    def propose(self, ids: list[int], k: int, params: SamplingParams, gen: torch.Generator | None) -> Proposal:
        """Up to k tokens after ids."""

    def observe(self, outcome: Outcome) -> None:
        """The round's verdict on this drafter's proposal."""

    def rollback(self, ids: list[int]) -> None:
        """The committed ids after a round: forget anything past them."""

    def reset(self) -> None: ...


class OwnK:
    """Adaptive K fitted to this drafter's own rounds of the running request, so a drafter's K is never learnt
    from another's rounds (the hybrid's free n-gram rounds would make the model's draft steps look cheap)."""

    adaptive: AdaptiveK

    def start(self) -> None:
        self.adaptive = AdaptiveK()

    def choose_k(self, spec: SpecParams) -> int:
        return self.adaptive.choose(spec) if spec.adaptive else spec.k

    def observe(self, o: Outcome) -> None:
        if o.learn_k and o.drafted:
            self.adaptive.observe(o.drafted, o.accepted, o.draft_s / o.drafted, o.verify_s)
