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
    own token equals it: one estimate serves greedy and sampling alike.

    Passes are not independent along a continuation: in copied text (a summary quoting its source) the first token
    of a match often fails, and once it passes the rest follow. So besides each length's rate a_n, each position i
    of its continuations keeps its own rate given that the tokens before it passed, shrunk towards a_n
    (POSITION_PRIOR pseudo-trials), and the chance the first i all pass is the product of those (`chain`): a_n^i
    while a position has seen little. The i-th token is proposed while that chance is at least MIN_PASS: below
    that a verify row costs more than it is expected to save.
    """

    name = "ngram"
    MIN_PASS = 0.3
    DECAY = 0.9  # recent rounds count most: the text's repetitiveness changes within a reply
    POSITION_PRIOR = 2.0  # pseudo-trials at the match length's own rate behind each position's rate

    def __init__(self, vocab: int, device: torch.device, n_min: int = 1, n_max: int = 4) -> None:
        self.vocab, self.device = vocab, device
        self.n_min, self.n_max = n_min, n_max
        self.ids: list[int] = []  # the ids indexed so far
        self.table: dict[tuple[int, ...], int] = {}  # n-gram -> index of the token that followed it last
        self.hits: dict[int, float] = {}  # match length -> decayed count of right continuation tokens
        self.trials: dict[int, float] = {}
        self.reached: dict[int, list[float]] = {}  # match length -> per position: decayed times the ones before passed
        self.passed: dict[int, list[float]] = {}  # ... and the times it passed then
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

    def chain(self, n: int, tokens: int, rate: float | None = None) -> tuple[float, ...]:
        """The chance that the first i tokens of an n-token match's continuation all pass, i = 1..tokens: the
        product of each position's rate given the ones before passed, each shrunk towards `rate` (default
        pass_rate(n))."""
        base = self.pass_rate(n) if rate is None else rate
        reached, passed = self.reached.get(n, []), self.passed.get(n, [])
        out, p = [], 1.0
        for i in range(tokens):
            seen, ok = (reached[i], passed[i]) if i < len(reached) else (0.0, 0.0)
            p *= (ok + self.POSITION_PRIOR * base) / (seen + self.POSITION_PRIOR)
            out.append(p)
        return tuple(out)

    def expected_passes(self, n_tokens: int) -> float:
        """Expected passing tokens of the last lookup's first n_tokens."""
        return sum(self.chain(self._pending[1], n_tokens)) if self._pending else 0.0

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

    def proposed(self, ids: list[int], k: int) -> list[int]:
        """What propose() drafts: the lookup's continuation as far as its chain stays at MIN_PASS or above."""
        n, cont = self.lookup(ids, k)
        return cont[: sum(1 for p in self.chain(n, len(cont)) if p >= self.MIN_PASS)]  # the chain only falls

    def propose(self, ids: list[int], k: int, params: SamplingParams, gen: torch.Generator | None) -> Proposal:
        return self.tokens(self.proposed(ids, k))

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
        reached = [r * self.DECAY for r in self.reached.get(n, [])]
        passed = [r * self.DECAY for r in self.passed.get(n, [])]
        for i, (want, got) in enumerate(zip(cont, ids[start:])):
            if i == len(reached):
                reached.append(0.0)
                passed.append(0.0)
            self.trials[n] += 1
            reached[i] += 1
            if want != got:
                break
            self.hits[n] += 1
            passed[i] += 1
        self.reached[n], self.passed[n] = reached, passed

    def reset(self) -> None:
        self.ids = []
        self.table.clear()
        self.hits.clear()
        self.trials.clear()
        self.reached.clear()
        self.passed.clear()
        self._pending = None
