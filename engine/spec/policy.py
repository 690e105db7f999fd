"""The hybrid drafter's policy: each round, the draft model (at a K up to the ceiling), the n-gram lookup's offer or no
draft, whichever is expected to commit the most tokens per second on this conversation.

Leviathan's arithmetic with measured costs. A round that drafts j tokens commits E_j tokens on average (accepted
drafts plus the correction or bonus) and costs its drafting plus one verify pass of width j + 1, so it makes
E_j / cost_j tokens per second; a plain step makes 1 / t(1). The costs, in plain steps, are measured on this
machine (engine.spec.round_costs), and a draft model that lags the committed text pays its catch-up pass spread
over the rounds it is then expected to draft.

Under the draft's stop rule the policy picks the ceiling too: a draft at ceiling j is the first j tokens of the draft
at any higher one, so the rounds' outcomes position by position (engine.spec.draft_positions) price every ceiling,
and where late drafts are often made but seldom pass (QA, where the draft model at K 2 ran 2-7% ahead of K 4 in
three speclens-bench runs on Zen 3) a lower ceiling commits the same tokens in fewer steps. The draft model's home is
K 2, and a higher ceiling must show a clear lead to be drafted at.

The draft model's acceptance is this request's, decayed so that it follows the text, and shrunk towards its long-run
acceptance on this engine (PRIOR_TRIALS pseudo-trials). Rounds the model does not draft age its recent evidence
(STALE per round), so an estimate from a bad patch relaxes towards the long run and a model that usually pays is
re-tried soon after the patch instead of after a fixed wait. A few rounds are little evidence: before a round goes
to no draft, the model is priced one standard error above its estimate (the spread of what its rounds committed over
the square root of their number), so a model close to plain on a few unlucky rounds drafts again, and the rounds it
spends away age its evidence until it does; one far below plain stays away. Exploration is still bounded: a
request's first FIRST_TRIES model rounds draft at the K ceiling, and a model out of favour drafts at least once every
EXPLORE_EVERY rounds. The n-gram lookup needs none: its continuations are scored against the committed text every
round, drafted or not.

Under sampling the choice reads no timings of its own reply (engine.spec.round_costs: a sampled reply must come
out the same from the same seed), and greedy output is the target's whatever the choices.

Only the choice lives here (pure functions of a PolicyState); the drafters draft, and each proposal is verified
against the q of the drafter that made it, so exactness is the drafters' own.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.analysis.theory import expected_tokens
from engine.spec.draft_positions import Forecast, PositionTally, expected_round
from engine.spec import round_costs
from engine.spec.round_costs import Costs, catchup_steps, model_c, observe_drafting, pass_steps, steps_of

MODEL, NGRAM, NONE = "model", "ngram", "none"

# After a model round that passed drafts, leaving the draft model for the n-gram lookup takes an estimate better by
# this share. The two are priced from pass timings that scatter 10-20% from round to round, so close estimates trade
# places on noise, and leaving the model is the costly mistake: its acceptance goes stale and it must read the ids it
# missed when it comes back. A round that passed nothing is acceptance, not noise, and the way back takes no margin.
# In the policy replay with 15% timing noise (scripts/bench/policy_replay.py, 10 seeds) it raised math 0.970 -> 0.983
# and RAG 0.944 -> 0.983 of the best fixed mode, summarization 0.950 -> 0.963; no kind lost, with noise or without.
SWITCH_MARGIN = 0.2
# Leaving the draft model for no draft takes plain ahead by this share, whatever the model's last round passed. The
# model pays 1.1-1.3x plain on most kinds with this pair, so its estimate sits close to plain, and a round or two that
# passed nothing (a 1-token draft it was unsure of) put it just below: on a Spec-Bench MT-bench prompt it went to no
# draft at 1.00x, the ids it then missed priced it lower every round away (0.57x after 15), and it drafted 18 of 109
# rounds where it alone ran 1.10x plain. Held, the model's own rounds measure it; where it really loses it leaves
# after a few, at a cost below the margin (QA, where no mode pays, ran 0.99x plain under the draft model alone).
# In the policy replay (10% timing noise, 8 seeds) MT-bench went 0.959 -> 0.992 of the best fixed mode and RAG
# 0.958 -> 0.982 (0.2 did as well there, and from 0.3 the model was never left for no draft at all); a model below
# 1 / 1.15 = 0.87x plain is still left at once, which bounds what a pair whose draft model loses can cost.
PLAIN_MARGIN = 0.15
EXPLORE_EVERY = 16  # rounds a drafter may go unused before it drafts one round to refresh its estimates
# Passes after which, if no plain step has run beside a wider pass, one does: a plain step is what every option is
# priced against, and while drafts win every round t(1) is only the prior's guess from the wider passes (on Zen 3 in
# a quiet hour a 2-row pass took 1.44 plain steps, not the prior's 1.15, and plain was priced 25% too dear). A
# probe costs a round's gain over plain once in PROBE_EVERY rounds, under 1% where the draft model runs 1.3x plain.
PROBE_EVERY = 32
# One standard deviation of what a model round commits, in tokens, until the long run has measured it (1.0-1.6 by
# kind on the 30 Spec-Bench questions' first turns at K <= 4 with the stop at 0.7, ~1.0-1.2 on QA, translation and
# RAG, where the model runs close to plain). With n rounds of evidence an estimate is uncertain by the spread over
# sqrt(n) (PolicyState.round_spread). Short replies are where it counts: on a 24-token translation reply the first
# six rounds passed 2 of 8 drafts, the model was priced at 0.84x plain and stayed away for the next 15 rounds, where
# the draft model drafting every round ran 1.05x plain. In the policy replay (10% timing noise, 3 seeds) it raised
# every kind but summarization (level) by 0.5-2% of the best fixed mode. On the real engine, with a fixed 1-token
# spread (the replay puts the two level), `policy_ab` B / A was 1.026, 1.057, 0.993, 1.009, 1.032, 1.011 (MT-bench,
# translation, summarization, QA, math, RAG; 30 questions' first turns, two repeats) and 1.043, 0.998, 0.967, 1.011
# (MT-bench, translation, QA, RAG) in a run before it.
UNCERTAIN_TOKENS = 1.0
FIRST_TRIES = 3  # a request's first draft-model rounds, drafted whatever the estimates say: one round is no measure
DECAY = 0.85  # weight of the past in the acceptance estimate per model round: predictability changes within a reply
STALE = 0.9  # weight of the recent evidence per round the model does not draft: old evidence says less about now
LONG_DECAY = 0.98  # weight of the past in the long-run acceptance, per model round, across requests
# A catch-up pass is paid once and then the draft model drafts several rounds in a row, so a round is charged this
# share of it. Larger values would keep a drafter that lost its lead drafting after the text turned predictable.
CATCHUP_ROUNDS = 4.0
# Priors, each worth a few rounds, for what has not been measured yet in this request.
PRIOR_ALPHA, PRIOR_TRIALS = 0.6, 2.0  # the long-run acceptance before any, and its weight in a request's estimate
# Under the stop rule the draft model's ceiling leaves its home (CEILING_HOME) only for an estimate better by this
# share, and never goes below MIN_CEILING. The ceilings' estimates differ by a few percent and rest on the few rounds
# that reached the late positions, so a bare maximum trades them on noise; in the policy replay (30 Spec-Bench
# questions, 10% timing noise) it chose K <= 1 in a quarter of the model rounds, where a fixed K 1 ran 9-10% under
# K 4, and lost 2-4% on four kinds. The stop rule already ends a draft the model is unsure of, so K <= 1 would only
# add rounds.
# A bare maximum over K 2-4 did no better on the real engine (policy_ab, Zen 3, 30 Spec-Bench first turns x 2,
# 2026-12-02): B / A 1.027 on QA, where the draft model at K 2 runs 3-4% ahead of K 4, but 0.949 on translation and
# 0.964 on MT-bench; on replies of 30-130 tokens the ceilings' estimates still trade on a few rounds. Nor did a bare
# maximum on the long run's positions alone (3005e34): QA 1.027 and MT-bench 1.026, but summarization 0.940 and RAG
# 0.931, and in that run the draft model at K 4 was ahead of K 2 on QA.
CEILING_MARGIN = 0.05
MIN_CEILING = 2
# The ceiling the draft model keeps unless another is CEILING_MARGIN ahead (0: the top, K). A draft's late positions
# are priced from the few rounds that reached them, so whichever ceiling is home wins every close call; K 2 is home
# because the draft model at K 2 ran ahead of K 4 on QA and translation in every pooled speclens-bench run (the A/B
# that kept it: docs/performance.md, Spec-Bench section).
CEILING_HOME = 2
# Below the top a round says nothing of the positions above its ceiling, so with a lower home one model round in
# TOP_EVERY drafts at the top: the late positions stay measured, and the top can win its margin where drafts run long.
TOP_EVERY = 4
PRIOR_GOES_ON = 0.6  # under the stop rule, the chance a draft goes on to its next position, before any was measured


@dataclass
class PolicyState(Costs):
    """What the policy knows: the measured costs of a round (engine.spec.round_costs.Costs, the same for every
    request) and the draft model's acceptance (this request's, and its long run)."""

    hits: float = 0.0  # the draft model's decayed accepted tokens in this request ...
    trials: float = 0.0  # ... over its decayed trials (accepted + 1 per rejection)
    long_hits: float = 0.0  # the same over every request, decayed slowly: the prior of each request's estimate
    long_trials: float = 0.0
    # With the draft's stop rule on (model_stops) the model drafts up to a ceiling and its own confidence ends the
    # draft, so a round at each ceiling is priced from what model rounds really drafted and passed, position by
    # position (in this request, and their long run), not from alpha under an every-token-alike assumption that the
    # stop rule breaks.
    model_stops: bool = False
    positions: PositionTally = field(default_factory=PositionTally)
    long_positions: PositionTally = field(default_factory=PositionTally)
    m_rounds: float = 0.0  # decayed model rounds in this request, with their committed tokens and its squares
    m_committed: float = 0.0
    m_squares: float = 0.0
    long_rounds: float = 0.0
    long_committed: float = 0.0
    long_squares: float = 0.0
    round: int = 0
    last_used: dict[str, int] = field(default_factory=dict)  # drafter -> the last round it drafted
    model_rounds: int = 0  # rounds the draft model drafted in this request
    last_drafter: str = NONE  # the drafter of the round before (MODEL, NGRAM or NONE)
    model_passed: bool = False  # whether the draft model's last round passed any draft

    def start(self) -> None:
        """A new request: acceptance and exploration start over; the measured costs and the long run stay."""
        self.hits, self.trials, self.round, self.last_used = 0.0, 0.0, 0, {}
        self.model_rounds = 0
        self.last_drafter = NONE
        self.m_rounds = self.m_committed = self.m_squares = 0.0
        self.positions = PositionTally()

    def model_round(self, ceiling: int) -> Forecast:
        """What a model round at `ceiling` commits and drafts under the stop rule, each position's chances shrunk
        towards the long run as alpha is (PRIOR_TRIALS pseudo-rounds)."""
        return expected_round(self.positions, self.long_positions, ceiling, PRIOR_GOES_ON, PRIOR_ALPHA, PRIOR_TRIALS)

    def round_spread(self) -> float:
        """The standard deviation of what a model round commits on this request, shrunk towards its long run (or
        UNCERTAIN_TOKENS before one) as the mean is: a model that commits the same every round is not uncertain."""
        def variance(rounds: float, committed: float, squares: float) -> float:
            return max(squares / rounds - (committed / rounds) ** 2, 0.0)

        if self.long_rounds >= PRIOR_TRIALS:
            v0 = variance(self.long_rounds, self.long_committed, self.long_squares)
        else:
            v0 = UNCERTAIN_TOKENS**2
        v = variance(self.m_rounds, self.m_committed, self.m_squares) if self.m_rounds > 0 else 0.0
        return ((self.m_rounds * v + PRIOR_TRIALS * v0) / (self.m_rounds + PRIOR_TRIALS)) ** 0.5

    def age_model(self) -> None:
        """A round the model did not draft: its recent evidence says less about the text now."""
        self.hits *= STALE
        self.trials *= STALE
        self.m_rounds *= STALE
        self.m_committed *= STALE
        self.m_squares *= STALE
        self.positions.scale(STALE)

    @property
    def prior_alpha(self) -> float:
        """The model's long-run acceptance on this engine (PRIOR_ALPHA until it has drafted a few rounds)."""
        if self.long_trials < PRIOR_TRIALS:
            return (self.long_hits + PRIOR_ALPHA * (PRIOR_TRIALS - self.long_trials)) / PRIOR_TRIALS
        return self.long_hits / self.long_trials

    @property
    def alpha(self) -> float:
        """The draft model's per-token acceptance on this request, shrunk towards its long run."""
        return min((self.hits + PRIOR_TRIALS * self.prior_alpha) / (self.trials + PRIOR_TRIALS), 0.999)


@dataclass(frozen=True)
class Offer:
    """The n-gram lookup's continuation this round: `tokens` of them after a `match`-token match, each passing with
    probability `pass_rate` (the lookup's own estimate for that match length). `chain`, where the lookup measured
    it: the chance that the first i tokens all pass, i = 1..tokens (passes along a copied span are not
    independent); otherwise pass_rate^i."""

    tokens: int
    match: int
    pass_rate: float
    chain: tuple[float, ...] = ()

    def passing(self, j: int) -> float:
        """Expected passing tokens among the first j."""
        if self.chain:
            return sum(self.chain[:j])
        return sum(self.pass_rate ** i for i in range(1, j + 1))


@dataclass(frozen=True)
class Choice:
    drafter: str  # MODEL, NGRAM or NONE
    k: int  # tokens to draft (the draft model's ceiling; the n-gram offer's prefix); 0 for NONE
    tokens: float  # expected tokens committed
    steps: float  # expected cost in plain steps
    reason: str

    @property
    def speedup(self) -> float:
        return self.tokens / self.steps


def observe_model(state: PolicyState, drafted: int, accepted: int, draft_s: float, verify_s: float = 0.0,
                  fed: int = 0, ceiling: int | None = None) -> None:
    """A draft-model round: its acceptance (a round that stopped at a rejection made accepted + 1 trials, one that
    passed whole made `drafted`) and, through round_costs.observe_drafting, its costs (fed: lagging ids its first
    pass read besides its own). ceiling: the most it could draft (None: `drafted`, which says nothing of where a
    draft that passed whole would have stopped)."""
    if drafted < 1:
        return
    ceiling = drafted if ceiling is None else max(ceiling, drafted)
    trials = accepted + (1 if accepted < drafted else 0)
    state.model_passed = accepted > 0
    state.hits = state.hits * DECAY + accepted
    state.trials = state.trials * DECAY + trials
    state.positions.add(ceiling, drafted, accepted, DECAY)
    state.m_rounds = state.m_rounds * DECAY + 1
    state.m_committed = state.m_committed * DECAY + accepted + 1
    state.m_squares = state.m_squares * DECAY + (accepted + 1) ** 2
    if state.measuring:  # the long run outlives the request: a sampled reply must leave it as it found it
        state.long_hits = state.long_hits * LONG_DECAY + accepted
        state.long_trials = state.long_trials * LONG_DECAY + trials
        state.long_positions.add(ceiling, drafted, accepted, LONG_DECAY)
        state.long_rounds = state.long_rounds * LONG_DECAY + 1
        state.long_committed = state.long_committed * LONG_DECAY + accepted + 1
        state.long_squares = state.long_squares * LONG_DECAY + (accepted + 1) ** 2
    observe_drafting(state, drafted, draft_s, verify_s, fed)


def model_options(state: PolicyState, k_max: int, lag: int, fed: int = 0) -> list[Choice]:
    """The draft model at each K in 1..k_max; lag: committed ids it must prefill before drafting (a catch-up pass);
    fed: lagging ids it reads with its first drafting pass instead (a wider pass, paid this round)."""
    c = model_c(state)
    catchup, why_catchup = 0.0, ""
    if lag > 0:
        catchup = catchup_steps(state, lag) / CATCHUP_ROUNDS
        why_catchup = f", catch-up {catchup * CATCHUP_ROUNDS:.2f} steps"
    elif fed > 0:
        # What one round of another drafter commits is paid in full: alternating, every model round pays its own.
        # Past that the lag is what an absence left, paid once on return and amortized as a catch-up is; charged in
        # full it grew with every round away, and after a bad patch the model stayed away (15 rounds of plain steps
        # on a Spec-Bench QA prompt where the draft model alone ran 1.11x plain).
        per_id = state.fed_row if state.fed_row is not None else round_costs.PRIOR_ROW * c
        now = min(fed, k_max + 1)
        catchup = per_id * (now + (fed - now) / CATCHUP_ROUNDS)
        why_catchup = f", reading {fed} new ids {catchup:.2f} steps"
    lookup = steps_of(state, state.lookup_s, 0.0)
    if state.model_stops:  # each ceiling, as far as the draft's confidence carries it
        out = []
        for k in range(1, k_max + 1):
            forecast = state.model_round(k)
            tokens, drafted = forecast.committed, forecast.drafted
            line = state.draft_line
            draft = line[0] + line[1] * drafted if line else drafted * c
            # The verify pass priced length by length: its cost is not a line in the width (on Zen 3 a 4-row pass
            # cost 1.56 plain steps, a 3-row one 1.20), so the pass at the mean width underprices a ceiling whose
            # drafts are sometimes long and often short (QA at K 4: by 0.07 steps, 5% of its round).
            verify = sum(chance * pass_steps(state, d + 1)[0] for d, chance in forecast.length_chances())
            steps = verify + draft + catchup + lookup
            why = (f"K \u2264 {k} (stops when unsure), {tokens:.1f} tok/round over {drafted:.1f} drafted, "
                   f"c {c:.2f}" + why_catchup)
            out.append(Choice(MODEL, k, tokens, steps, why))
        return out
    a = state.alpha
    out = []
    for k in range(1, k_max + 1):
        tokens = expected_tokens(a, k)
        steps = pass_steps(state, k + 1)[0] + k * c + catchup + lookup
        why = f"K {k}, \u03b1 {a:.2f}, c {c:.2f}" + why_catchup
        out.append(Choice(MODEL, k, tokens, steps, why))
    return out


def ngram_options(state: PolicyState, offer: Offer | None) -> list[Choice]:
    """The first j tokens of the lookup's continuation, each j: Offer.passing(j) pass on average."""
    if offer is None or offer.tokens < 1:
        return []
    lookup = steps_of(state, state.lookup_s, 0.0)
    out = []
    for j in range(1, offer.tokens + 1):
        tokens = 1.0 + offer.passing(j)
        why = (f"{offer.match}-token match, {j} of {offer.tokens} tokens at pass rate {offer.pass_rate:.2f}"
               + (f" (all {j} pass {offer.chain[j - 1]:.2f})" if offer.chain else ""))
        out.append(Choice(NGRAM, j, tokens, pass_steps(state, j + 1)[0] + lookup, why))
    return out


def choose(state: PolicyState, offer: Offer | None, k_max: int, model_lag: int, have_model: bool = True,
           model_fed: int = 0) -> Choice:
    """This round's drafter, K and why (model_lag, model_fed: model_options' lag and fed). Advances the round
    counter; the caller reports the outcome with observe_*."""
    state.round += 1
    lookup = steps_of(state, state.lookup_s, 0.0)
    plain = Choice(NONE, 0, 1.0, 1.0 + lookup, "")
    models = model_options(state, k_max, model_lag, model_fed) if have_model and k_max >= 1 else []
    model = pick_model(state, models)
    ngrams = ngram_options(state, offer)
    best = max([plain, *model, *ngrams], key=lambda ch: ch.speedup)  # ties: plain first, then the model
    explored = ""
    held = _held(state, best, plain, model)
    if held is not None:
        rival, margin = ("n-gram", SWITCH_MARGIN) if best.drafter == NGRAM else ("no draft", PLAIN_MARGIN)
        explored, best = f"kept: {rival} ahead by less than {margin:.0%}", held
    if best.drafter == NONE and models and model_lag == 0:
        explored, best = _uncertain(state, best, plain, model[0])
    # round 0 for a model that has not drafted in this request: with FIRST_TRIES = 0 (policy_ab --set) it is re-tried
    # after EXPLORE_EVERY rounds like one out of favour
    last, tries = state.last_used.get(MODEL, 0), state.model_rounds
    # A re-try that must first catch the model up costs that pass too: it comes as much less often, so that exploring
    # costs the same share of the time (on summarization, where the n-gram drafter commits several ids a round, every
    # re-try read 40-odd ids first, ~3 steps each time).
    every = round(EXPLORE_EVERY * (1 + catchup_steps(state, model_lag)))
    if models and tries < FIRST_TRIES:  # at the ceiling: each round then measures every draft position
        explored, best = f"first tries, {tries + 1} of {FIRST_TRIES}", models[-1]
    elif (state.model_stops and best.drafter == MODEL and best.k < models[-1].k
          and (tries - FIRST_TRIES) % TOP_EVERY == TOP_EVERY - 1):
        explored, best = f"at the ceiling once in {TOP_EVERY} model rounds", models[-1]
    elif models and best.drafter != MODEL and state.round - last >= every:
        explored = f"re-try after {state.round - last - 1} rounds unused"
        best = model[0]
    elif best.drafter != NONE and _probe_due(state):
        explored, best = "a plain step beside the drafts measures what their rows cost against it", plain
    state.last_drafter = best.drafter
    if best.drafter != NONE:
        state.last_used[best.drafter] = state.round
    if best.drafter == MODEL:
        state.model_rounds += 1
    elif models:
        state.age_model()
    return _explain(best, plain, model, ngrams, explored)


def _probe_due(state: PolicyState) -> bool:
    """Whether this round is a plain step that measures t(1) beside the drafts' wider passes (PROBE_EVERY). Greedy
    replies only: a probe is a choice from the costs' own measurements (round_costs' note on sampling)."""
    return state.measuring and state.last_drafter != NONE and state.passes - state.plain_paired >= PROBE_EVERY


def pick_model(state: PolicyState, models: list[Choice]) -> list[Choice]:
    """The draft model's option this round ([] without one): the best K, or under the stop rule the ceiling, which
    leaves CEILING_HOME only for an estimate better by CEILING_MARGIN and never goes below MIN_CEILING."""
    if not models:
        return []
    if not state.model_stops:
        return [max(models, key=lambda ch: ch.speedup)]
    home = models[-1] if CEILING_HOME < 1 else models[min(max(CEILING_HOME, MIN_CEILING), len(models)) - 1]
    best = max(models[min(MIN_CEILING, len(models)) - 1 :], key=lambda ch: ch.speedup)
    return [best if best.speedup > home.speedup * (1 + CEILING_MARGIN) else home]


def _uncertain(state: PolicyState, best: Choice, plain: Choice, keep: Choice) -> tuple[str, Choice]:
    """No draft leads, but the model's estimate rests on its rounds of evidence: where one standard error more
    (round_spread / sqrt(rounds)) puts it ahead of plain, it drafts, and that round measures it. Called only with
    no catch-up pass to pay: a return that must first read dozens of ids (after a run of n-gram rounds) costs steps
    that one round's evidence does not repay."""
    rounds = state.m_rounds + PRIOR_TRIALS
    reach = (keep.tokens + state.round_spread() / rounds**0.5) / keep.steps
    if reach <= plain.speedup:
        return "", best
    return (f"uncertain: {keep.speedup / plain.speedup:.2f}x on {rounds:.1f} rounds of evidence, "
            f"{reach / plain.speedup:.2f}x one standard error up"), keep


def _held(state: PolicyState, best: Choice, plain: Choice, model: list[Choice]) -> Choice | None:
    """The draft model's best option after a model round, where `best` is no draft by less than PLAIN_MARGIN, or,
    after a round that passed drafts, the n-gram lookup's by less than SWITCH_MARGIN while the model still beats no
    draft. A round that passed nothing is the lookup's evidence, not timing noise: the model then gives way to the
    lookup as soon as it trails."""
    if state.last_drafter != MODEL or best.drafter == MODEL or not model:
        return None
    keep = model[0]
    if best.drafter == NONE:
        return keep if keep.speedup * (1 + PLAIN_MARGIN) >= plain.speedup else None
    if not state.model_passed:
        return None
    if keep.speedup < plain.speedup or keep.speedup * (1 + SWITCH_MARGIN) < best.speedup:
        return None
    return keep


def _explain(best: Choice, plain: Choice, models: list[Choice], ngrams: list[Choice], explored: str) -> Choice:
    """The choice with its reason: what it is expected to make, and the best of each alternative."""
    def rate(chs: list[Choice]) -> float | None:
        return max((c.speedup for c in chs), default=None) if chs else None

    others = [f"{name} {r / plain.speedup:.2f}x"
              for name, chs in (("model", models), ("n-gram", ngrams), ("plain", [plain]))
              if chs and best not in chs and (r := rate(chs)) is not None]
    est = f"est {best.tokens:.1f} tok/round at {best.steps:.2f} steps = {best.speedup / plain.speedup:.2f}x plain"
    if best.drafter == NONE:
        head = f"no draft: {explored}" if explored else "no draft: neither drafter pays"
        reason = f"{head} ({', '.join(others)})" if others else "no draft: no drafter available"
    else:
        label = "model" if best.drafter == MODEL else "ngram"
        tried = f" ({explored})" if explored else ""
        reason = f"{label}{tried}: {best.reason}, {est}" + (f"; {', '.join(others)}" if others else "")
    return Choice(best.drafter, best.k, best.tokens, best.steps, reason)
