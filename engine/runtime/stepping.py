"""Step-through as hooks the round loop calls: after drafting, after the verify pass, after the decision and the
rollback. `NoSteps` does nothing (an unstepped round); `RoundSteps` sends a PhaseEvent and waits at the gate.

Nothing here draws a random number or changes a cache, so a stepped request decodes exactly the tokens an unstepped
one does; the time spent here (building the events and waiting) is paused on the round loop's clock.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from engine.api.events import CacheRollback, CommittedToken, Phase, PhaseEvent
from engine.api.live import Controls
from engine.runtime.clock import Clock

Marks = list[tuple[str, int, int]]  # (cache, positions, blocks)


class NoSteps:
    """The hooks of a round that is not stepped."""

    def drafted(self) -> None: ...

    def verified(self, p: torch.Tensor) -> None: ...

    def before_rollback(self) -> None: ...

    def decided(self, accepted: int, p_drafted: Sequence[float], committed: Sequence[CommittedToken]) -> None: ...


NO_STEPS = NoSteps()


class RoundSteps(NoSteps):
    """One round under step-through: each hook pauses at the gate after sending its PhaseEvent."""

    def __init__(self, controls: Controls, clock: Clock, marks: Callable[[], Marks], text_of: Callable[[int], str],
                 round_no: int, drafter: str | None, k: int, proposal: Any) -> None:
        """marks: what the caches hold now; drafter: the name of the drafter that drafted, None in plain mode."""
        self.controls, self.clock, self.marks = controls, clock, marks
        self.round, self.drafter = round_no, drafter
        self.k = k if drafter is not None else 0
        self._before: Marks = []
        with clock.paused():
            tokens = proposal.tokens.tolist() if proposal is not None else []
            self.tokens = tuple(tokens)
            self.texts = tuple(text_of(tok) for tok in tokens)
            self.q = tuple(_at(proposal.q, tokens)) if tokens else ()
            self.reason = proposal.reason if proposal is not None else ""  # why this drafter drafted (hybrid)

    def _event(self, phase: Phase, **kw: Any) -> PhaseEvent:
        return PhaseEvent(self.round, phase, self.drafter, self.k, self.tokens, self.texts, self.q, reason=self.reason,
                          **kw)

    def _pause(self, make: Callable[[], PhaseEvent]) -> None:
        gate = self.controls.gate
        if not gate.stepping or self.controls.cancelled:
            return
        with self.clock.paused():
            if self.controls.on_phase is not None:
                self.controls.on_phase(make())
            gate.wait()

    def drafted(self) -> None:
        if self.tokens:
            self._pause(lambda: self._event(Phase.DRAFTED))

    def verified(self, p: torch.Tensor) -> None:
        """p: the target's (K+1, V) probabilities after the sampling transforms."""
        if self.tokens:
            self._pause(lambda: self._event(Phase.VERIFIED, p=tuple(_at(p, list(self.tokens)))))

    def before_rollback(self) -> None:
        self._before = self.marks()

    def decided(self, accepted: int, p_drafted: Sequence[float], committed: Sequence[CommittedToken]) -> None:
        rollback = rollbacks(self._before, self.marks())
        self._pause(lambda: self._event(Phase.DECIDED, p=tuple(p_drafted), accepted=accepted,
                                        committed=tuple(committed), rollback=rollback))


def rollbacks(before: Marks, after: Marks) -> tuple[CacheRollback, ...]:
    return tuple(CacheRollback(name, pos0, pos1, blk0, blk1)
                 for (name, pos0, blk0), (_, pos1, blk1) in zip(before, after))


def _at(dist: torch.Tensor, tokens: list[int]) -> list[float]:
    """dist[i, tokens[i]] for each row i, as floats."""
    rows = torch.arange(len(tokens), device=dist.device)
    return dist[rows, torch.tensor(tokens, dtype=torch.long, device=dist.device)].float().tolist()
