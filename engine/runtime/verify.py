"""The verify and accept/reject phases of a round: the target scores [g, t1..tK] in one pass, then the rule keeps a
prefix of the drafts and draws the correction or the bonus token (a plain step draws from the first row)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from engine.api.config import SamplingParams
from engine.api.dists import PositionDist
from engine.api.events import Origin
from engine.model.attention import ROW_WISE_MAX
from engine.model.kv_cache import KVPool
from engine.model.transformer import Transformer
from engine.spec.accept import Verdict, accept_reject
from engine.spec.drafters import Proposal
from engine.spec.inspection import inspect_round
from engine.spec.sampling import probs_for_positions, sample


@dataclass(frozen=True)
class Scores:
    logits: torch.Tensor  # (K+1, V) the target's raw scores
    p: torch.Tensor  # (K+1, V) after the sampling transforms


def short_passes(n: int) -> list[tuple[int, int]]:
    """[0, n) in passes of at most ROW_WISE_MAX rows: only such passes score each row exactly as a plain step
    does (engine.model.attention), so a K of 16 or more is verified in two or more passes."""
    return [(a, min(a + ROW_WISE_MAX, n)) for a in range(0, n, ROW_WISE_MAX)]


def score(target: Transformer, pool: KVPool, ids: list[int], drafted: torch.Tensor, params: SamplingParams,
          vocab: int, device: torch.device) -> Scores:
    """The target scores the last committed token and the drafts (in one pass up to K = 15), appended to the
    target's cache (sequence 0)."""
    feed = torch.cat([torch.tensor([ids[-1]], dtype=torch.long, device=device), drafted.to(device)])  # (K+1,)
    start, _ = pool.manager.append(0, len(feed))
    parts = [target(feed[a:b], start + a, pool.view(0, start + a, start + b)) for a, b in short_passes(len(feed))]
    logits = (parts[0] if len(parts) == 1 else torch.cat(parts))[:, :vocab]  # (K+1, V); one part: no copy
    context = torch.tensor(ids, dtype=torch.long, device=device)
    return Scores(logits, probs_for_positions(logits, params, context, drafted))


def decide(drafted: torch.Tensor, proposal: Proposal | None, p: torch.Tensor,
           gen: torch.Generator) -> tuple[list[int], list[Origin], Verdict]:
    """The round's committed tokens (before any stop), their origins, and the verdict."""
    if len(drafted) == 0:  # a plain decode step
        tok = sample(p[0], gen)
        return [tok], [Origin.PLAIN], Verdict(0, tok, (), (), float(p[0, tok]))
    assert proposal is not None
    v = accept_reject(drafted, proposal.q, p, gen)
    tokens = drafted[: v.accepted].tolist() + [v.next_token]
    return tokens, [Origin.ACCEPTED] * v.accepted + [Origin.BONUS if v.bonus else Origin.CORRECTED], v


def inspector_rows(scores: Scores, drafted: torch.Tensor, proposal: Proposal | None, v: Verdict,
                   text_of: Callable[[int], str], greedy: bool) -> tuple[PositionDist, ...]:
    """The round's rows for the inspector, one per verify position."""
    shown = scores.logits if greedy else None  # point masses say little: show the logits
    spec = len(drafted) > 0 and proposal is not None
    return inspect_round(scores.p, proposal.q if spec else None, drafted, v.u, v.accepted, v.next_token, text_of,
                         logits=shown, draft_logits=proposal.logits if spec and shown is not None else None)
