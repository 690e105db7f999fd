"""Prompt lookup: the latest earlier occurrence of the text's suffix proposes what followed it. Its proposal is a
point mass, so q(t) = 1 and rejection sampling stays exact."""
from __future__ import annotations

import torch

from engine.api.config import SamplingParams, SpecParams
from engine.model.forward import common_prefix
from engine.spec.drafters.base import OwnK, Proposal
from engine.spec.sampling import point_mass


class NGramDrafter(OwnK):
    """Prompt lookup over prompt + generated ids, longest context first (n_max down to n_min).

    It proposes only what is likely to pass. Each match length n keeps an estimate of how often its
    continuation is right, scored after every round against the tokens the target committed, whether the
    continuation was proposed or only looked up (so a length that stopped proposing can earn its way back).
    For a point mass q = 1 a draft passes with probability p(t), which is also the chance that the target's
    own token equals it: one estimate serves greedy and sampling alike. The i-th token is proposed while the
    chance the first i all pass, a_n^i, is at least MIN_PASS: below that a verify row costs more than it
    is expected to save.
    """

    name = "ngram"
    MIN_PASS = 0.3
    DECAY = 0.9  # recent rounds count most: the text's repetitiveness changes within a reply

    def __init__(self, vocab: int, device: torch.device, n_min: int = 1, n_max: int = 4) -> None:
        self.vocab, self.device = vocab, device
        self.n_min, self.n_max = n_min, n_max
        self.ids: list[int] = []  # the ids indexed so far
        self.table: dict[tuple[int, ...], int] = {}  # n-gram -> index of the token that followed it last
        self.hits: dict[int, float] = {}  # match length -> decayed count of right continuation tokens
        self.trials: dict[int, float] = {}
        self._pending: tuple[int, int, list[int]] | None = None  # (len(ids), n, continuation) of the last lookup
        self.start()

    def configure(self, spec: SpecParams) -> None:
        if (spec.ngram_min, spec.ngram_max) != (self.n_min, self.n_max):
            self.n_min, self.n_max = spec.ngram_min, spec.ngram_max
            self.reset()

    def _index(self, ids: list[int]) -> None:
        if common_prefix(self.ids, ids) < len(self.ids):  # history changed (a new conversation): rebuild
            self.reset()
        # Index every n-gram whose follower is known; the suffix itself is never its own match.
        for j in range(max(len(self.ids), 1), len(ids)):
            for n in range(self.n_min, self.n_max + 1):
                if j - n >= 0:
                    self.table[tuple(ids[j - n : j])] = j
        self.ids = list(ids)

    def pass_rate(self, n: int) -> float:
        """Estimated chance that a continuation token after an n-token match passes (Laplace prior 1/2)."""
        return (self.hits.get(n, 0.0) + 1.0) / (self.trials.get(n, 0.0) + 2.0)

    def pooled_pass_rate(self, n: int) -> float:
        """pass_rate(n) shrunk towards every match length's rate together rather than towards 1/2: a length seen
        rarely (long matches are) borrows what the text's other lookups say, so one lucky prior cannot outbid a
        measured drafter. The pool itself starts from the Laplace prior."""
        pooled = (sum(self.hits.values()) + 1.0) / (sum(self.trials.values()) + 2.0)
        return (self.hits.get(n, 0.0) + 2.0 * pooled) / (self.trials.get(n, 0.0) + 2.0)

    def expected_passes(self, n_tokens: int) -> float:
        """Expected passing tokens of the last lookup's first n_tokens: sum of a_n^i for i = 1..n_tokens."""
        a = self.pass_rate(self._pending[1]) if self._pending else 0.0
        return sum(a ** (i + 1) for i in range(n_tokens))

    def lookup(self, ids: list[int], k: int) -> tuple[int, list[int]]:
        """(match length, up to k tokens that followed the longest match), (0, []) when nothing matches. The lookup
        is remembered and scored against the committed text at the next rollback, whether or not it is drafted."""
        self._index(ids)
        n, cont = 0, []
        for m in range(min(self.n_max, len(ids)), self.n_min - 1, -1):
            j = self.table.get(tuple(ids[-m:]))
            if j is not None:
                n, cont = m, ids[j : j + k]
                break
        self._pending = (len(ids), n, cont) if cont else None
        return n, cont

    def tokens(self, cont: list[int]) -> Proposal:
        """A proposal of these continuation tokens: a point mass on each."""
        t = torch.tensor(cont, dtype=torch.long, device=self.device)
        return Proposal(t, point_mass(t, self.vocab))

    def propose(self, ids: list[int], k: int, params: SamplingParams, gen: torch.Generator | None) -> Proposal:
        n, cont = self.lookup(ids, k)
        a, take = self.pass_rate(n), 0
        while take < len(cont) and a ** (take + 1) >= self.MIN_PASS:
            take += 1
        return self.tokens(cont[:take])

    def rollback(self, ids: list[int]) -> None:
        """Score the last lookup's continuation against what the target committed (the table itself holds
        committed ids only, so there is nothing to undo)."""
        if self._pending is None:
            return
        start, n, cont = self._pending
        self._pending = None
        if ids[:start] != self.ids[:start]:  # not the text we looked up in
            return
        self.hits[n] = self.hits.get(n, 0.0) * self.DECAY
        self.trials[n] = self.trials.get(n, 0.0) * self.DECAY
        for want, got in zip(cont, ids[start:]):
            self.trials[n] += 1
            if want != got:
                break
            self.hits[n] += 1

    def reset(self) -> None:
        self.ids = []
        self.table.clear()
        self.hits.clear()
        self.trials.clear()
        self._pending = None
