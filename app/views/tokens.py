"""What the chat knows of each painted token: its kind, round, position and probabilities, and its tooltip.

Shared by the chat view, the inspector and the trace window; no widgets here.
"""
from __future__ import annotations

import html
from dataclasses import dataclass, field

from app.views.theme import ORIGIN_HELP, ORIGIN_LABEL
from engine.api.dists import PositionDist
from engine.api.events import Origin, RoundEvent

REJECTED = "rejected"  # the first draft the target turned down
PROVISIONAL = "provisional"  # step-through: a draft on screen before the target has decided on it
DISCARDED = "discarded"  # drafts after it: never verified, dropped with it


@dataclass(frozen=True)
class TokenInfo:
    """What a painted token was; `kind` is an Origin value, REJECTED or DISCARDED."""

    kind: str
    round: int
    position: int  # within the round, 0-based
    token_id: int
    text: str
    p: float | None
    q: float | None
    event: RoundEvent | None = field(default=None, compare=False, repr=False)  # its round, for the inspector

    @property
    def dist(self) -> PositionDist | None:
        """The inspector's data for this token's row of the verify pass, when the engine recorded it."""
        rows = self.event.positions if self.event is not None else ()
        return rows[self.position] if self.position < len(rows) else None

    @property
    def accept_prob(self) -> float | None:
        if self.p is None or self.q is None:
            return None
        return min(1.0, self.p / self.q) if self.q > 0 else 0.0


def visible(text: str) -> str:
    """Whitespace made visible, for tooltips and struck-through drafts."""
    return text.replace(" ", "\u2423").replace("\n", "\u21b5").replace("\t", "\u21e5") or "\u2205"


def token_tooltip(info: TokenInfo) -> str:
    """Rich-text tooltip: what the token is, where it sits, and its probabilities."""
    if info.kind in (REJECTED, DISCARDED):
        title = "Rejected draft" if info.kind == REJECTED else "Discarded draft"
        note = ("the target turned it down (u \u2265 min(1, p/q))" if info.kind == REJECTED
                else "never verified: an earlier draft in this round was rejected")
    else:
        origin = Origin(info.kind)
        title, note = ORIGIN_LABEL[origin], ORIGIN_HELP[origin]

    def num(v: float | None) -> str:  # NaN: a value the source never sent (an attached server's p and q)
        return "\u2014" if v is None or v != v else f"{v:.4f}"

    rows = [
        ("round", str(info.round)),
        ("position in round", str(info.position + 1)),
        ("q(t) draft", num(info.q)),
        ("p(t) target", num(info.p)),
        ("min(1, p/q)", num(info.accept_prob)),
        ("token", f"{info.token_id if info.token_id >= 0 else ''} \u00ab{html.escape(visible(info.text))}\u00bb"),
    ]
    body = "".join(f"<tr><td>{k}</td><td align='right'><tt>{v}</tt></td></tr>" for k, v in rows)
    hint = "<br><small>Click for its distributions</small>" if info.dist is not None else ""
    return (f"<b>{title}</b><br><i>{html.escape(note)}</i><table cellspacing='0' cellpadding='1'>{body}</table>"
            f"{hint}")
