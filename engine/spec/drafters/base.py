"""What every drafter is: it proposes up to K tokens (and their q) after the committed ids, forgets what a round
rejected, and keeps its own record of its rounds, from which adaptive K learns its K."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import torch

from engine.api.config import SamplingParams, SpecParams
from engine.spec.adaptive import AdaptiveK


@dataclass(frozen=True)
class Proposal:
    tokens: torch.Tensor  # (n,), n <= K; n == 0 means "nothing to propose: decode plainly"
    q: torch.Tensor  # (n, V)
    prefill_s: float = 0.0  # part of the propose() time spent catching the drafter's cache up (prompt prefill)
    logits: torch.Tensor | None = None  # (n, V) under greedy, where q is a point mass: what the inspector shows
    source: str | None = None  # the name of the drafter that made it, when that is not the one asked (hybrid)


@dataclass(frozen=True)
class Outcome:
    """How a drafter's round went, as the round loop measured it."""

    drafter: str  # the drafter that drafted (under the hybrid, the one it picked)
    drafted: int
    accepted: int
    draft_s: float  # drafting time, its cache's catch-up prefill left out
    verify_s: float
    learn_k: bool  # adaptive K is on: fit its model to this round


@dataclass
class DraftRecord:
    """One drafter's rounds in the running request (as llama.cpp's drafters count theirs), and adaptive K's fit."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    adaptive: AdaptiveK = field(default_factory=lambda: AdaptiveK())  # looked up at each request's start

    def observe(self, o: Outcome) -> None:
        self.rounds += 1
        self.drafted += o.drafted
        self.accepted += o.accepted
        if o.learn_k and o.drafted:
            self.adaptive.observe(o.drafted, o.accepted, o.draft_s / o.drafted, o.verify_s)

    def choose_k(self, spec: SpecParams) -> int:
        return self.adaptive.choose(spec) if spec.adaptive else spec.k


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


class Recorded:
    """A drafter's record, its adaptive K and the plain ways to use them."""

    record: DraftRecord

    def start(self) -> None:
        self.record = DraftRecord()

    def choose_k(self, spec: SpecParams) -> int:
        return self.record.choose_k(spec)

    def observe(self, outcome: Outcome) -> None:
        self.record.observe(outcome)
