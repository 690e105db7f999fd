"""What a round costs on this machine, in plain steps, as the hybrid's policy (engine.spec.policy) prices its options.

Everything is priced in plain steps, t(1): the verify pass of width w costs t(w) / t(1) steps (the pass shape,
measured width by width from passes in a row of different widths), a draft-model token c steps (its measured
drafting time over t(1); once drafts of two lengths are measured, a draft of d tokens costs a line through them,
since its first token costs more than the next), and a catch-up pass of the draft model's cache a measured cost per
id.

Costs are medians of the last WINDOW measurements, not running means: on a busy machine a pass the scheduler preempted
takes several times its cost, and one such pass in a mean priced the draft model out for a dozen rounds. c is the
median of each model round's own ratio (drafting seconds per token over that round's verify pass brought to one
step), so a load that changes from one minute to the next moves both sides of the ratio together. Pass times, a
property of the machine and the pair, carry over from earlier requests.

Costs are measured only while decoding greedily (`Costs.measuring`). A sampled reply must come out the same from the
same seed (step-through, the comparison and the tuner rely on it), and each choice changes how many random numbers a
round draws; so under sampling the policy reads only the seeded outcomes and costs fixed before the reply (those
greedy replies measured, or the priors), never its own timings.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from statistics import median

WINDOW = 9  # measurements per cost whose median is the estimate (odd: a true median)
LEVEL_WINDOW = 3  # the level follows the load within two rounds and still drops one stalled pass
MAX_LINE = 16  # draft lengths whose costs the draft line is fitted to (the K slider's top)
# Priors for what has not been measured yet on this machine.
PRIOR_C = 0.3  # a draft-model token in plain steps
PRIOR_ROW = 0.15  # what each verify row past the first adds, in plain steps (0.06-0.44 measured on Zen 3/4 CPUs)
TYPICAL = (2 / 3, 1.5)  # a pass's time over the level's prediction, outside which it measures no shape
PRIOR_CATCHUP_ID = 0.3  # what each id of a catch-up pass costs, in draft-model tokens (0.25-0.3 measured on Zen 3)


class Recent:
    """The median of the last `window` measurements of one cost."""

    def __init__(self, window: int = WINDOW) -> None:
        self.values: deque[float] = deque(maxlen=window)

    def add(self, value: float) -> float:
        self.values.append(value)
        return median(self.values)


@dataclass
class Costs:
    """Measured costs (seconds; each the median of its recent measurements), the same for every request."""

    level_s: float | None = None  # t(1) now: recent passes, each divided by its width's shape
    shape: tuple[float, ...] = ()  # t(w) / t(1) for w = 1, 2, ... as far as pairs measured it (fit_shape)
    passes: int = 0  # passes measured
    plain_paired: int = 0  # `passes` when a one-row pass last measured the shape beside a wider one
    last_pass: tuple[int, float, bool] | None = None  # (width, seconds, usual) of the pass before
    model_token_s: float | None = None  # the draft model's drafting seconds per drafted token
    model_c: float | None = None  # a drafted token in plain steps, each model round's own ratio (None: from the above)
    catchup_id_s: float | None = None  # what each id of a catch-up pass of the draft model's cache costs
    draft_line: tuple[float, float] | None = None  # (intercept, per token) of a draft's cost in plain steps
    fed_row: float | None = None  # what each lagging id fed with the first drafting pass adds, in plain steps
    lookup_s: float = 0.0  # the n-gram lookup (paid every round, whatever is chosen)
    measuring: bool = True  # this round's timings may update the costs (greedy decoding: see the module's note)
    recent: dict[str, Recent] = field(default_factory=dict)  # cost name -> its last measurements

    def measure(self, name: str, value: float, window: int = WINDOW) -> float:
        """Add a measurement of cost `name`; returns its estimate (the median of its last `window`)."""
        return self.recent.setdefault(name, Recent(window)).add(value)


def observe_pass(costs: Costs, width: int, seconds: float) -> None:
    """A verify pass of `width` rows (drafted + 1) took `seconds`.

    A pass's time is the machine's level now (t(1) at this minute's load) times its width's shape t(w) / t(1), a
    property of the kernels. Two passes in a row of different widths ran at nearly the same load, so their ratio
    measures the shape alone; widths whose times were gathered minutes apart on a busy machine would fit a curve of
    scheduling noise. The level is the recent passes, each divided by its shape."""
    if not (costs.measuring and seconds > 0 and width >= 1):
        return
    # A pass far from what the level and shape predict was preempted (or the load just changed): it still moves the
    # level, but a pair with it in says nothing about the kernels' shape.
    expected = costs.level_s * pass_steps(costs, width)[0] if costs.level_s else None
    usual = expected is None or TYPICAL[0] <= seconds / expected <= TYPICAL[1]
    last, costs.last_pass = costs.last_pass, (width, seconds, usual)
    if last is not None and last[0] != width and usual and last[2]:
        (a, ta), (b, tb) = sorted([(last[0], last[1]), (width, seconds)])
        costs.measure(f"widths {a}:{b}", math.log(tb / ta))
        costs.shape = fit_shape(costs)
        if a == 1:
            costs.plain_paired = costs.passes
    costs.passes += 1
    costs.level_s = costs.measure("level", seconds / pass_steps(costs, width)[0], LEVEL_WINDOW)


def fit_shape(costs: Costs) -> tuple[float, ...]:
    """t(w) / t(1) for w = 1 .. the widest pass measured. The widths that measured pairs join are fitted together:
    log t(w) by least squares to each pair's median log ratio, weighted by its measurements. Widths joined to t(1)
    are known outright; a group that no pair joins to t(1) (drafts alone, which never pass one row) is placed by
    the prior line 1 + PRIOR_ROW (w - 1) from the nearest width below it; a width no pair measured lies on the
    straight line between its neighbours. A line through t(1) misprices both ends: on Zen 3 in a quiet hour the
    second row added 0.44 of a step and the fifth 0.21, and a line through the 2-5-row passes of model rounds put
    t(1) 13-25% above a plain step, so the policy took a draft model at 0.9x plain for 1.2-1.3x. Wider never costs
    less, and a row never more than a step."""
    pairs = []
    for name, recent in costs.recent.items():
        if name.startswith("widths "):
            a, b = map(int, name[len("widths "):].split(":"))
            pairs.append((a, b, median(recent.values), float(len(recent.values))))
    top = max((b for _, b, _, _ in pairs), default=1)
    groups: list[set[int]] = []
    for a, b, _, _ in pairs:
        joined = [g for g in groups if a in g or b in g]
        groups = [g for g in groups if g not in joined] + [set().union({a, b}, *joined)]
    log_s: dict[int, float] = {1: 0.0}
    for group in sorted(groups, key=min):  # lowest first: each is placed from the widths below it
        base = 1 if 1 in group else min(group)
        x = _least_squares(sorted(group - {base}), base, [p for p in pairs if p[0] in group])
        if base != 1:
            below = max(w for w in log_s if w < base)
            x = {w: v + log_s[below] + math.log(_prior(base) / _prior(below)) for w, v in x.items()}
            x[base] = log_s[below] + math.log(_prior(base) / _prior(below))
        log_s.update(x)
    shape = [1.0]
    for w in range(2, top + 1):
        if w in log_s:
            s = math.exp(log_s[w])
        else:  # between measured widths
            lo, hi = max(v for v in log_s if v < w), min(v for v in log_s if v > w)
            s_lo, s_hi = math.exp(log_s[lo]), math.exp(log_s[hi])
            s = s_lo + (w - lo) * (s_hi - s_lo) / (hi - lo)
        shape.append(min(max(s, shape[-1]), shape[-1] + 1.0))
    return tuple(shape)


def _prior(width: int) -> float:
    return 1.0 + PRIOR_ROW * (width - 1)


def _least_squares(widths: list[int], base: int, pairs: list[tuple[int, int, float, float]]) -> dict[int, float]:
    """log t(w) - log t(base) for `widths`: least squares over pairs (a, b, log t(b) / t(a), weight) that join them."""
    index = {w: i for i, w in enumerate(widths)}
    n = len(widths)
    A = [[0.0] * n for _ in range(n)]
    r = [0.0] * n
    for a, b, m, weight in pairs:  # the normal equations of sum weight (x_b - x_a - m)^2, x_base = 0
        for w, sign in ((a, -1.0), (b, 1.0)):
            if w == base:
                continue
            r[index[w]] += sign * weight * m
            for v, other in ((a, -1.0), (b, 1.0)):
                if v != base:
                    A[index[w]][index[v]] += sign * other * weight
    return dict(zip(widths, _solve(A, r)))


def _solve(A: list[list[float]], r: list[float]) -> list[float]:
    """A x = r by Gaussian elimination (A symmetric positive definite: the pairs join every width to the base)."""
    n = len(r)
    A, r = [row[:] for row in A], r[:]
    for i in range(n):
        for j in range(i + 1, n):
            f = A[j][i] / A[i][i]
            for c in range(i, n):
                A[j][c] -= f * A[i][c]
            r[j] -= f * r[i]
    x = [0.0] * n
    for i in reversed(range(n)):
        x[i] = (r[i] - sum(A[i][c] * x[c] for c in range(i + 1, n))) / A[i][i]
    return x


def observe_drafting(costs: Costs, drafted: int, draft_s: float, verify_s: float = 0.0, fed: int = 0) -> None:
    """A draft-model round drafted `drafted` tokens in `draft_s`: its drafting time per token and, with the round's
    verify pass `verify_s`, c as this round's own ratio and the cost of a draft of this length. fed: lagging ids its
    first pass read besides its own (text other rounds committed); such a round measures what a lagging id adds
    instead of c."""
    if not (costs.measuring and draft_s > 0 and drafted >= 1):
        return
    step = verify_s / pass_steps(costs, drafted + 1)[0] if verify_s > 0 else 0.0
    if fed:
        if step > 0 and costs.model_c is not None:
            # at most c: an id read in a pass that runs anyway never costs more than a pass of its own. The
            # difference of two timings over a few ids is noisy, and a preempted round after one of the window's
            # plain steps (one lagging id) once read as several steps an id, priced the model out and kept it
            # out while its lag grew.
            extra = min(max(draft_s / step - drafted * costs.model_c, 0.0) / fed, costs.model_c)
            costs.fed_row = costs.measure("fed row", extra)
        return
    costs.model_token_s = costs.measure("model token", draft_s / drafted)
    if step > 0:
        costs.model_c = costs.measure("model c", draft_s / drafted / step)
        costs.measure(f"draft of {drafted}", draft_s / step)
        costs.draft_line = _draft_line(costs)


def _draft_line(costs: Costs) -> tuple[float, float] | None:
    """(steps a draft costs whatever its length, steps each drafted token adds): a line through the median cost of
    each draft length measured, or None before two lengths are. A draft's first token costs more than the next
    (the round's sampling and stop-rule work), so c alone would overprice long drafts against short ones."""
    lengths = [(d, costs.recent.get(f"draft of {d}")) for d in range(1, MAX_LINE + 1)]
    points = [(d, median(r.values)) for d, r in lengths if r is not None and len(r.values) >= 2]
    if len(points) < 2:
        return None
    n = len(points)
    mx, my = sum(d for d, _ in points) / n, sum(y for _, y in points) / n
    slope = sum((d - mx) * (y - my) for d, y in points) / sum((d - mx) ** 2 for d, _ in points)
    slope = max(slope, 0.0)
    return max(my - slope * mx, 0.0), slope


def observe_catchup(costs: Costs, tokens: int, seconds: float) -> None:
    """The draft model caught up with `tokens` committed ids in one pass of `seconds` (a prompt's reading too: its
    chunks cost what a catch-up's ids do)."""
    if costs.measuring and tokens > 0 and seconds > 0:
        costs.catchup_id_s = costs.measure("catch-up id", seconds / tokens)


def observe_lookup(costs: Costs, seconds: float) -> None:
    if costs.measuring:
        costs.lookup_s = costs.measure("lookup", max(seconds, 0.0))


def pass_steps(costs: Costs, width: float) -> tuple[float, float]:
    """(t(width) / t(1), t(1) seconds or 0 when nothing is measured): the measured shape (observe_pass), linear
    between widths (a round that drafts 1.5 tokens on average passes 2.5 rows), and past the widest measured on the
    line from t(1) through it (the prior line 1 + PRIOR_ROW (w - 1) before any pair)."""
    shape = costs.shape or (1.0,)
    top = len(shape)
    if width <= 1:
        return 1.0, costs.level_s or 0.0
    if width <= top:
        lo = int(width)
        hi = min(lo + 1, top)
        return shape[lo - 1] + (width - lo) * (shape[hi - 1] - shape[lo - 1]), costs.level_s or 0.0
    row = (shape[-1] - 1.0) / (top - 1) if top > 1 else PRIOR_ROW
    return shape[-1] + row * (width - top), costs.level_s or 0.0


def steps_of(costs: Costs, seconds: float | None, prior_steps: float) -> float:
    """`seconds` in plain steps at the current level; `prior_steps` before either is measured."""
    step = pass_steps(costs, 1)[1]
    return seconds / step if seconds is not None and step > 0 else prior_steps


def model_c(costs: Costs) -> float:
    """A draft-model token in plain steps."""
    return costs.model_c if costs.model_c is not None else steps_of(costs, costs.model_token_s, PRIOR_C)


def catchup_steps(costs: Costs, lag: int) -> float:
    """A catch-up pass over `lag` committed ids, in plain steps (0 where none is needed). Priced by the id: after a
    run of n-gram rounds the draft model may lag by dozens of ids, a pass of several steps (~5.5 for 62 ids on Zen 3)
    that a re-try of the model pays first."""
    if lag <= 0:
        return 0.0
    return lag * steps_of(costs, costs.catchup_id_s, PRIOR_CATCHUP_ID * model_c(costs))
