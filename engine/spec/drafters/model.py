"""The draft model: a small model over its own paged cache, prefilled lazily on first use, that drafts token by token
and stops early when its own confidence in the whole draft falls below the stop rule's threshold."""
from __future__ import annotations

import time
from collections.abc import Callable

import torch

from engine.api.config import SamplingParams, SpecParams
from engine.model.forward import common_prefix, forward_chunked
from engine.model.kv_cache import KVPool
from engine.model.transformer import Transformer
from engine.spec.drafters.base import DraftStopped, OwnK, Proposal
from engine.spec.sampling import greedy_token, point_mass, probs_from_logits, sample

# Committed ids the draft cache may lag by and still take them in its first drafting pass, one pass of width
# lag + 1 instead of a catch-up pass and then a one-token pass: a round leaves it one behind (the last drafted token
# after a bonus), a few n-gram rounds of the hybrid a few more. On the quantized kernels a pass's cost grows slowly with
# its width, so this saves about one draft step each time the draft model drafts after the n-gram lookup. A longer
# lag (a prompt) is prefilled in chunks of its own, with progress and a way to stop.
MAX_ROUND_LAG = 16


def lag_split(behind: int) -> tuple[int, int]:
    """(ids prefilled in a catch-up pass, ids read with the first drafting pass besides the one every round leaves)
    for a draft cache `behind` committed ids (ModelDrafter._behind): a lag up to MAX_ROUND_LAG is read in the first
    drafting pass, a longer one caught up first."""
    return (behind, 0) if behind > MAX_ROUND_LAG else (0, max(behind - 1, 0))


def confidence(logits: torch.Tensor, q: torch.Tensor | None, token: int, greedy: bool) -> float:
    """How sure the draft is of the token it drafted: q(token), or under greedy (where q is a point mass, and
    need not be given) the softmax of its logits at T = 1. logits, q (n,): the draft head's rows, `token` a row."""
    if greedy:
        return float(torch.softmax(logits, -1)[token])
    return float(q[token])


class ModelDrafter(OwnK):
    name = "model"

    def __init__(self, model: Transformer, pool: KVPool, vocab: int, device: torch.device) -> None:
        self.model, self.pool, self.vocab, self.device = model, pool, vocab, device
        self.seq = 0
        pool.manager.allocate(self.seq)
        self.cached: list[int] = []  # ids whose KV is in the draft cache
        self.last_catchup: tuple[int, float] = (0, 0.0)  # (ids, seconds) the latest propose prefilled first
        self.stop_below = 0.0  # SpecParams.stop_below: see propose
        self.stop: Callable[[], bool] | None = None  # asked between the chunks of a long prefill (a cancel)
        self.progress: Callable[[int, int, int], None] | None = None  # a prefill's (read, to read, reused) per chunk
        self.start()

    def configure(self, spec: SpecParams) -> None:
        self.stop_below = spec.stop_below

    def _behind(self, ids: list[int]) -> int:
        return len(ids) - 1 - min(common_prefix(self.cached, ids), len(ids) - 1)

    def catchup_tokens(self, ids: list[int]) -> int:
        """Committed ids the next propose(ids) would prefill before drafting (0 when a round's feed covers them)."""
        return lag_split(self._behind(ids))[0]

    def fed_tokens(self, ids: list[int]) -> int:
        """Committed ids the next propose(ids) reads with its first drafting pass besides the one a round leaves
        unread (0 when none, or when they are many enough for a prefill of their own)."""
        return lag_split(self._behind(ids))[1]

    def _sync(self, ids: list[int]) -> None:
        keep = min(common_prefix(self.cached, ids), len(ids) - 1)
        self.pool.manager.truncate_to(self.seq, keep)
        del self.cached[keep:]

    def _prefill(self, ids: list[int]) -> float:
        """Bring the draft cache up to ids[:-1] when it lags by more than a round leaves; returns seconds."""
        behind = ids[len(self.cached) : -1]
        self.last_catchup = (0, 0.0)
        if len(behind) <= MAX_ROUND_LAG:
            return 0.0  # fed together with the last token, as part of drafting
        t0 = time.perf_counter()
        report, reused, read = self.progress, len(self.cached), None
        if report is not None:
            report(0, len(behind), reused)
            read = lambda done: report(done, len(behind), reused)
        if forward_chunked(self.model, self.pool, self.seq, behind, self.device, self.stop, progress=read) is None:
            self.cached.extend(behind[: self.pool.manager.length(self.seq) - len(self.cached)])  # the chunks done
            raise DraftStopped
        self.cached.extend(behind)
        if self.device.type == "cuda":  # kernels run asynchronously: time them, not their launch
            torch.cuda.synchronize(self.device)
        self.last_catchup = (len(behind), time.perf_counter() - t0)
        return self.last_catchup[1]

    def propose(self, ids: list[int], k: int, params: SamplingParams, gen: torch.Generator | None) -> Proposal:
        """Up to k tokens; fewer when stop_below > 0 and the product of the draft's confidences in its tokens
        (`confidence`) falls below it. The rule reads only the draft's own outputs, so each proposed token is
        still a draw from q and verification stays exact; it saves draft steps and verify rows that would
        likely be rejected. A trimmed head's draft samples in the head's own rows (q is 0 outside them) and widens
        only its q rows and shown logits to the vocabulary."""
        self._sync(ids)
        prefill_s = self._prefill(ids)  # lazy prefill: the first round catches up with the whole prompt here
        head = self.model.head
        n = head.rows_below(self.vocab) if head is not None else self.vocab  # the rows a token is drawn from
        context = torch.tensor(ids, dtype=torch.long, device=self.device)
        ctx = head.rows_of(context) if head is not None else context  # the penalty's context, as head rows
        feed = ids[len(self.cached) :]
        rows: list[int] = []  # the drafted tokens' rows in the head
        qs: list[torch.Tensor] = []  # sampling only: greedy's q rows are point masses, made once at the end
        raw: list[torch.Tensor] = []  # greedy only: the inspector shows them instead of point masses
        survive = 1.0  # the draft's own estimate that every token so far passes
        for i in range(k):
            logits = forward_chunked(self.model, self.pool, self.seq, feed, self.device, head_rows=True)[:n]  # (n,)
            self.cached.extend(feed)
            if params.greedy:
                r = greedy_token(logits, params, ctx)
                raw.append(logits.clone())  # a copy: the model may reuse its output buffer
            else:
                qs.append(probs_from_logits(logits, params, ctx))  # (n,)
                r = sample(qs[-1], gen)
            rows.append(r)
            feed = [r if head is None else int(head.ids[r])]
            if params.repetition_penalty != 1.0:  # the only reader of the context
                ctx = torch.cat([ctx, torch.tensor([r], dtype=torch.long, device=self.device)])
            if self.stop_below > 0.0 and i + 1 < k:
                survive *= confidence(logits, qs[-1] if qs else None, r, params.greedy)
                if survive < self.stop_below:
                    break
        tokens = torch.tensor(rows, dtype=torch.long)
        if head is not None:
            tokens = head.ids[tokens]
        tokens = tokens.to(self.device)
        if params.greedy:
            shown = torch.stack(raw)  # (m, n)
            shown = head.widen(shown, float("-inf"), self.vocab) if head is not None else shown
            return Proposal(tokens, point_mass(tokens, self.vocab), prefill_s, shown)
        q = torch.stack(qs)  # (m, n)
        q = head.widen(q, 0.0, self.vocab) if head is not None else q  # (m, vocab)
        return Proposal(tokens, q, prefill_s, None)

    def rollback(self, ids: list[int]) -> None:
        self._sync(ids)

    def reset(self) -> None:
        self.pool.manager.truncate_to(self.seq, 0)
        self.cached.clear()
