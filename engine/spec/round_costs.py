"""What a round costs on this machine, in plain steps, as the hybrid's policy (engine.spec.policy) prices its options.

Everything is priced in plain steps, t(1): the verify pass of width w costs t(w) / t(1) steps (the shape
1 + rho (w - 1), rho measured from passes in a row of different widths), a draft-model token c steps (its measured
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

from collections import deque
from dataclasses import dataclass, field
from statistics import median

WINDOW = 9  # measurements per cost whose median is the estimate (odd: a true median)
LEVEL_WINDOW = 3  # the level follows the load within two rounds and still drops one stalled pass
MAX_LINE = 16  # draft lengths whose costs the draft line is fitted to (the K slider's top)
# Priors for what has not been measured yet on this machine.
PRIOR_C = 0.3  # a draft-model token in plain steps
PRIOR_ROW = 0.15  # what each verify row past the first adds, in plain steps (0.06-0.28 measured on Zen 3/4 CPUs)
ROW_PRIOR_WEIGHT = 3  # pseudo-measurements of rho at PRIOR_ROW beside the measured pairs (observe_pass)
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
    row: float | None = None  # rho: what a verify row past the first adds, in plain steps (None: not measured yet)
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

    A pass's time is the machine's level now (t(1) at this minute's load) times its width's shape, 1 + rho (w - 1),
    rho being what a row adds (a property of the kernels). Two passes in a row of different widths ran at nearly the
    same load, so their ratio measures rho alone; widths whose times were gathered minutes apart on a busy machine
    would fit a line of scheduling noise. The level is the recent passes, each divided by its shape."""
    if not (costs.measuring and seconds > 0 and width >= 1):
        return
    # A pass far from what the level and shape predict was preempted (or the load just changed): it still moves the
    # level, but a pair with it in says nothing about the kernels' shape.
    expected = costs.level_s * pass_steps(costs, width)[0] if costs.level_s else None
    usual = expected is None or TYPICAL[0] <= seconds / expected <= TYPICAL[1]
    last, costs.last_pass = costs.last_pass, (width, seconds, usual)
    if last is not None and last[0] != width and usual and last[2]:
        r = seconds / last[1]
        den = (width - 1) - r * (last[0] - 1)  # from r = (1 + rho (width - 1)) / (1 + rho (last width - 1))
        if abs(den) > 1e-6:
            costs.measure("row", min(max((r - 1) / den, -1.0), 2.0))
            # Among ROW_PRIOR_WEIGHT pseudo-measurements at the prior, so that a few pairs do not decide it: a median
            # of three noisy pairs once priced a 5-row n-gram pass at one step, and the hybrid took 11 failing n-gram
            # rounds in a row on a 2-core machine with one core busy.
            costs.row = median([*costs.recent["row"].values, *[PRIOR_ROW] * ROW_PRIOR_WEIGHT])
    costs.level_s = costs.measure("level", seconds / pass_steps(costs, width)[0], LEVEL_WINDOW)


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


def pass_steps(costs: Costs, width: int) -> tuple[float, float]:
    """(t(width) / t(1), t(1) seconds or 0 when nothing is measured): the shape 1 + rho (width - 1), rho measured
    from passes in a row of different widths (observe_pass) or the prior, and the current level."""
    rho = PRIOR_ROW if costs.row is None else min(max(costs.row, 0.0), 1.0)  # a row never costs more than a pass
    return 1.0 + rho * (width - 1), costs.level_s or 0.0


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
