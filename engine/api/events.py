"""What `Engine.generate` yields: one RoundEvent per round, then one Summary."""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from engine.api.dists import PositionDist


class Origin(str, Enum):
    """How a committed token was made."""

    ACCEPTED = "accepted"  # a draft token the target kept
    CORRECTED = "corrected"  # the target's resample after a rejection
    BONUS = "bonus"  # sampled from the target after all K drafts passed
    PLAIN = "plain"  # plain target decode (speculation off, or no draft available)


@dataclass(frozen=True)
class DraftToken:
    """One drafted token and its verdict. p and q are after the sampling transforms."""

    token_id: int
    text: str
    q: float  # draft probability q(t); 1.0 for the n-gram drafter's point mass
    p: float  # target probability p(t)
    accepted: bool

    @property
    def accept_prob(self) -> float:
        """min(1, p/q): the chance this token passes verification."""
        return min(1.0, self.p / self.q) if self.q > 0 else 0.0


@dataclass(frozen=True)
class CommittedToken:
    """A token that became part of the reply. `text` is its share of the incremental detokenization
    (it may be "" when the token ends mid-character; the next token then carries the whole character)."""

    token_id: int
    text: str
    origin: Origin
    index: int  # position within the round, 0-based
    p: float  # target probability of this token
    q: float | None = None  # draft probability when it was a draft token


@dataclass(frozen=True)
class RoundEvent:
    round: int  # 1-based round number within the request
    mode: str  # "speculative" or "plain"
    drafter: str | None  # "model" or "ngram" (the one that drafted, also under the hybrid drafter), None in plain mode
    k: int  # K in force this round (the drafter may propose fewer)
    temperature: float
    drafted: tuple[DraftToken, ...]  # in order; verification stops at the first rejected one
    committed: tuple[CommittedToken, ...]  # accepted drafts, then the correction or bonus token
    text_delta: str  # text added to the reply this round
    draft_ms: float
    verify_ms: float
    elapsed_s: float  # since the request started
    new_tokens: int  # committed so far in this request, this round included
    stop_reason: str | None = None  # set on the last round: "eos", "stop", "length", "cancelled"
    draft_prefill_ms: float = 0.0  # the draft model catching up with the prompt; not part of draft_ms
    # The inspector's view of each verify row (engine/api/dists.py): row i is drafted[i] and committed[i]; the last
    # row is the bonus (or plain) token's. Empty when the engine did not record it.
    positions: tuple[PositionDist, ...] = ()
    # Why this drafter and K made the round, in words (the hybrid's policy: its estimates and the alternatives);
    # "" when the drafter was not chosen round by round.
    reason: str = ""

    @property
    def accepted(self) -> int:
        return sum(d.accepted for d in self.drafted)

    @property
    def correction(self) -> CommittedToken | None:
        last = self.committed[-1] if self.committed else None
        return last if last is not None and last.origin in (Origin.CORRECTED, Origin.BONUS, Origin.PLAIN) else None


@dataclass(frozen=True)
class Summary:
    """The whole request at a glance."""

    new_tokens: int
    rounds: int
    target_forwards: int
    drafted: int
    accepted: int
    acceptance_rate: float  # accepted / drafted (0 when nothing was drafted)
    mean_tokens_per_round: float
    per_position_acceptance: tuple[float, ...]  # P(draft position i accepted | it was drafted)
    tokens_per_s: float  # decode rate: new tokens / (total time - the target's and the draft's prompt prefills)
    ttft_s: float  # time to first token (includes the prefill)
    total_s: float
    prompt_tokens: int
    reused_prefix_tokens: int  # prompt tokens whose KV came from the previous turn
    draft_ms: float  # summed draft time
    verify_ms: float  # summed verify / plain-decode time
    stop_reason: str
    text: str
    token_ids: tuple[int, ...] = field(default=())
    prefill_s: float = 0.0  # target prefill of the uncached prompt suffix
    draft_prefill_ms: float = 0.0  # summed draft-model prefill (excluded from draft_ms)
    text_tail: str = ""  # text released at a cancel that no RoundEvent carried: text == deltas + text_tail


@dataclass(frozen=True)
class PrefillProgress:
    """A long prompt being read into a model's cache, after each chunk (engine/model/forward.py): `done` of the
    `total` tokens this prefill feeds, past the `reused` ones whose KV was already cached. The target reads the
    prompt before the first round; the draft model catches up with it in the first round that drafts with it.

    It goes to `Controls.on_prefill`, not through generate()'s yields, as PhaseEvent goes to `on_phase`: the
    reading happens inside the prefill and inside the first round's draft, where nothing can be yielded."""

    model: str  # "target" or "draft"
    done: int  # tokens read so far by this prefill
    total: int  # tokens this prefill reads
    reused: int = 0  # prompt tokens before them whose KV came from the cache

    def __post_init__(self) -> None:
        if self.model not in ("target", "draft"):
            raise ValueError(f"model must be 'target' or 'draft', got {self.model!r}")
        if not 0 <= self.done <= self.total or self.reused < 0:
            raise ValueError(f"a prefill reads 0 <= done <= total tokens past reused >= 0; got {self.done} of "
                             f"{self.total} past {self.reused}")


# ---- step-through (optional: only a request with stepping on produces these) ------------------------------------


class Phase(str, Enum):
    """Where a round stands when step-through pauses it."""

    DRAFTED = "drafted"  # the drafter proposed; the target has not looked yet
    VERIFIED = "verified"  # the target's p is known at every drafted position; nothing decided yet
    DECIDED = "decided"  # accept/reject done, the correction or bonus drawn, both caches rolled back


@dataclass(frozen=True)
class CacheRollback:
    """One KV cache across a round's rollback: the positions and blocks it held before and after."""

    cache: str  # "target" or "draft"
    positions_before: int
    positions_after: int
    blocks_before: int
    blocks_after: int

    def __post_init__(self) -> None:
        if self.cache not in ("target", "draft"):
            raise ValueError(f"cache must be 'target' or 'draft', got {self.cache!r}")
        if min(self.positions_before, self.positions_after, self.blocks_before, self.blocks_after) < 0:
            raise ValueError(f"negative cache size in {self}")

    @property
    def positions_freed(self) -> int:
        return max(0, self.positions_before - self.positions_after)

    @property
    def blocks_freed(self) -> int:
        return max(0, self.blocks_before - self.blocks_after)


@dataclass(frozen=True)
class PhaseEvent:
    """One phase of a round while step-through holds the engine at `Controls.gate` (see engine/api/live.py).

    It goes to `Controls.on_phase`, not through generate()'s yields: the RoundEvent stays the one record of a
    round, and a request that does not step never builds one. A round that drafts nothing (plain decoding, or an
    n-gram drafter with no match) has only its DECIDED phase.
    """

    round: int  # the round's number, as its RoundEvent will carry it
    phase: Phase
    drafter: str | None
    k: int
    tokens: tuple[int, ...]  # the drafted ids, in order
    texts: tuple[str, ...]  # each drafted token decoded on its own
    q: tuple[float, ...]  # q(t_i) for each drafted token
    p: tuple[float, ...] = ()  # p(t_i), from VERIFIED on
    accepted: int | None = None  # drafts kept, from DECIDED on
    committed: tuple[CommittedToken, ...] = ()  # DECIDED: the accepted drafts, then the correction or bonus
    rollback: tuple[CacheRollback, ...] = ()  # DECIDED: the target's cache, and the draft model's if any
    reason: str = ""  # why this drafter and K made the round, as its RoundEvent will carry it

    def __post_init__(self) -> None:
        n = len(self.tokens)
        if len(self.texts) != n or len(self.q) != n or len(self.p) not in (0, n):
            raise ValueError(f"a PhaseEvent needs one text, one q and (once verified) one p per drafted token; "
                             f"got {n} tokens, {len(self.texts)} texts, {len(self.q)} q, {len(self.p)} p")
        if self.phase != Phase.DRAFTED and n and not self.p:
            raise ValueError(f"the {self.phase.value} phase needs p for the drafted tokens")
        if self.phase == Phase.DECIDED and (self.accepted is None or not 0 <= self.accepted <= n):
            raise ValueError(f"the decided phase needs 0 <= accepted <= {n}, got {self.accepted}")
