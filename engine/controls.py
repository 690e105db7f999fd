"""What may change while a request runs, read by the engine at the start of every round. No torch here, so the
engine process's command reader (engine/service.py) can hold one without importing the engine."""
from __future__ import annotations

from .config import SamplingParams, SpecParams


class Controls:
    """Values another thread may change while a request runs; read at the start of every round.

    Each attribute is replaced whole (never mutated in place), so a round sees a consistent value.
    """

    def __init__(self, sampling: SamplingParams, spec: SpecParams) -> None:
        self.sampling = sampling
        self.spec = spec
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True
