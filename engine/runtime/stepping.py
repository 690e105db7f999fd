"""Step-through on the engine's side: one round's PhaseEvents and the pause at the gate after each.

Built only while a request steps (reading q and p back costs host syncs). Nothing here draws a random number or
changes a cache, so a stepped request decodes exactly the tokens an unstepped one does; the time spent here (the
events and the wait) goes to `Engine.paused_s`, which the engine's clock leaves out of every timing.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from engine.api.live import Controls
from engine.api.events import CacheRollback, CommittedToken, Phase, PhaseEvent

Marks = list[tuple[str, int, int]]  # (cache, positions, blocks)


def cache_marks(engine: Any, drafter: Any) -> Marks:
    """What the target's cache and the draft model's (when it drafts this round) hold now."""
    m = engine.target_pool.manager
    marks = [("target", m.length(0), len(m.block_table(0)))]
    pool = getattr(drafter, "pool", None)  # the n-gram drafter keeps no cache
    if pool is not None:
        marks.append(("draft", pool.manager.length(drafter.seq), len(pool.manager.block_table(drafter.seq))))
    return marks


def rollbacks(before: Marks, after: Marks) -> tuple[CacheRollback, ...]:
    return tuple(CacheRollback(name, pos0, pos1, blk0, blk1)
                 for (name, pos0, blk0), (_, pos1, blk1) in zip(before, after))


class RoundSteps:
    """One round under step-through: `drafted()`, `verified(p)`, `decided(...)`, each pausing at the gate."""

    def __init__(self, engine: Any, controls: Controls, round_no: int, drafter: str | None, k: int,
                 proposal: Any) -> None:
        """drafter: the name of the drafter that drafted this round, None in plain mode."""
        t = time.perf_counter()
        self.engine, self.controls, self.round = engine, controls, round_no
        self.drafter = drafter
        self.k = k if drafter is not None else 0
        tokens = proposal.tokens.tolist() if proposal is not None else []
        self.tokens = tuple(tokens)
        self.texts = tuple(engine._piece(tok) for tok in tokens)
        self.q = tuple(_at(proposal.q, tokens)) if tokens else ()
        engine.paused_s += time.perf_counter() - t

    def _event(self, phase: Phase, **kw: Any) -> PhaseEvent:
        return PhaseEvent(self.round, phase, self.drafter, self.k, self.tokens, self.texts, self.q, **kw)

    def _pause(self, make: Any) -> None:
        gate = self.controls.gate
        if not gate.stepping or self.controls.cancelled:
            return
        t = time.perf_counter()
        if self.controls.on_phase is not None:
            self.controls.on_phase(make())
        gate.wait()
        self.engine.paused_s += time.perf_counter() - t

    def drafted(self) -> None:
        if self.tokens:
            self._pause(lambda: self._event(Phase.DRAFTED))

    def verified(self, p: torch.Tensor) -> None:
        """p: the target's (K+1, V) probabilities after the sampling transforms."""
        if self.tokens:
            self._pause(lambda: self._event(Phase.VERIFIED, p=tuple(_at(p, list(self.tokens)))))

    def decided(self, accepted: int, p_drafted: Sequence[float], committed: Sequence[CommittedToken],
                before: Marks, after: Marks) -> None:
        self._pause(lambda: self._event(Phase.DECIDED, p=tuple(p_drafted), accepted=accepted,
                                        committed=tuple(committed), rollback=rollbacks(before, after)))


def _at(dist: torch.Tensor, tokens: list[int]) -> list[float]:
    """dist[i, tokens[i]] for each row i, as floats."""
    rows = torch.arange(len(tokens), device=dist.device)
    return dist[rows, torch.tensor(tokens, dtype=torch.long, device=dist.device)].float().tolist()
