"""The hybrid drafter's policy (engine.spec.policy): on scripted cost and acceptance streams it picks the drafter
that makes the most tokens per second, follows the stream when it changes, decodes plainly when nothing pays and
re-tries a drafter out of favour at a bounded rate; through the real engine the output stays exact with it on."""
from __future__ import annotations

from itertools import pairwise

import pytest

from engine.api.config import SamplingParams, SpecParams
from engine.api.events import DraftToken, RoundEvent, Summary
from engine.spec import policy, round_costs
from engine.spec.policy import MODEL, NGRAM, NONE, Choice, Offer, PolicyState
from engine.tools.specbench import Tally, decode_seconds
from tests.engine.test_exactness import (
    PROMPTS,
    assert_exact_distribution,
    run,
    small_pair,
)
from tests.tiny import tiny_engine

STEP_S = 0.010  # a plain step on the scripted machine


def machine(row: float = 0.05, c: float = 0.2) -> PolicyState:
    """A state whose pass times were measured at widths 1-5: t(w) = STEP_S (1 + row (w - 1)), and whose draft model
    costs c steps a token."""
    state = PolicyState()
    for _ in range(3):
        for w in range(1, 6):
            round_costs.observe_pass(state, w, STEP_S * (1 + row * (w - 1)))
    state.model_token_s = c * STEP_S
    return state


def model_round(state: PolicyState, k: int, accepted: int, c: float = 0.2) -> None:
    policy.observe_model(state, k, accepted, k * c * STEP_S)


def test_pass_times_fit_a_line_in_plain_steps():
    state = machine(row=0.1)
    steps, step_s = round_costs.pass_steps(state, 5)
    assert step_s == pytest.approx(STEP_S)
    assert steps == pytest.approx(1.4)


def test_the_better_drafter_is_picked_on_a_scripted_stream():
    """The model accepts ~90% at c = 0.2: it beats a weak n-gram offer; a long, sure n-gram offer (free drafting)
    beats the model."""
    state = machine()
    state.model_rounds, state.last_used[MODEL] = policy.FIRST_TRIES, 0
    for _ in range(10):
        model_round(state, 4, 4 if state.round % 10 else 3)
    weak = Offer(tokens=2, match=1, pass_rate=0.3)
    ch = policy.choose(state, weak, 4, model_lag=0)
    assert ch.drafter == MODEL and ch.k >= 3, ch
    assert ch.reason.startswith("model: K ")
    sure = Offer(tokens=4, match=4, pass_rate=0.97)
    ch = policy.choose(state, sure, 4, model_lag=0)
    assert ch.drafter == NGRAM and ch.k == 4, ch
    assert ch.reason.startswith("ngram: 4-token match") and "x plain" in ch.reason


def test_the_cheaper_drafter_wins_at_equal_acceptance():
    """The same acceptance from both: the n-gram lookup drafts for free, so it wins while the model costs c > 0."""
    state = machine(c=0.3)
    state.model_rounds, state.last_used[MODEL] = policy.FIRST_TRIES, 0
    for _ in range(20):
        model_round(state, 3, 2, c=0.3)  # alpha ~ 2/3
    ch = policy.choose(state, Offer(tokens=3, match=2, pass_rate=state.alpha), 3, model_lag=0)
    assert ch.drafter == NGRAM, ch


def test_the_choice_follows_the_stream_when_it_changes():
    """The model passes almost everything, then nothing: within a few rounds the policy leaves it."""
    state = machine()
    offer = Offer(tokens=2, match=2, pass_rate=0.5)
    picks = []
    for r in range(60):
        ch = policy.choose(state, offer, 4, model_lag=0)
        picks.append(ch.drafter)
        if ch.drafter == MODEL:
            model_round(state, ch.k, ch.k if r < 20 else 0)
    assert picks[:20] == [MODEL] * 20, picks
    left = picks.index(NGRAM)
    assert 20 < left <= 26, picks  # a few rejected rounds are enough to leave a model that passed everything
    # Once left, the model is re-tried (its long run says it usually pays) but every re-try fails, so the re-tries
    # thin out: never two in a row, at most one round in four, and the gaps do not shrink.
    tries = [i for i in range(left, len(picks)) if picks[i] == MODEL]
    gaps = [b - a for a, b in pairwise(tries)]
    assert tries and len(tries) <= (len(picks) - left) / 4, picks
    assert all(g >= 4 for g in gaps) and gaps == sorted(gaps), picks


def test_the_model_is_left_only_for_a_clear_lead():
    """Estimates from timings that scatter trade places on noise: after a model round that passed drafts the n-gram
    lookup must lead by SWITCH_MARGIN to take over; after one that passed nothing, or on the way back to the model,
    no margin holds, and no draft wins as soon as it leads."""
    def state_after(last: str, passed: int = 3) -> PolicyState:
        state = machine()
        state.model_rounds, state.last_used[MODEL] = policy.FIRST_TRIES, 0
        for _ in range(10):
            model_round(state, 4, 3)
        model_round(state, 4, passed)
        state.last_drafter = last
        return state

    model = max(policy.model_options(state_after(MODEL), 4, 0), key=lambda ch: ch.speedup).speedup

    def ngram(rate: float) -> float:
        return max(ch.speedup for ch in policy.ngram_options(state_after(MODEL), Offer(4, 3, rate)))

    ahead = next(r / 100 for r in range(1, 100) if ngram(r / 100) > model * 1.05)  # the lookup 5-10% ahead
    assert ngram(ahead) < model * 1.1
    ch = policy.choose(state_after(MODEL), Offer(4, 3, ahead), 4, model_lag=0)
    assert ch.drafter == MODEL and "kept: n-gram ahead by less than 20%" in ch.reason, ch
    assert policy.choose(state_after(MODEL), Offer(4, 4, 0.99), 4, model_lag=0).drafter == NGRAM  # a clear lead
    assert policy.choose(state_after(NGRAM), Offer(4, 3, ahead), 4, model_lag=0).drafter == NGRAM
    # the model's last round passed nothing: it is left as soon as it trails, here by 5-10%
    trailing = max(policy.model_options(state_after(MODEL, passed=0), 4, 0), key=lambda ch: ch.speedup).speedup
    just_ahead = next(r / 100 for r in range(1, 100) if ngram(r / 100) > trailing * 1.05)
    assert ngram(just_ahead) < trailing * 1.1
    assert policy.choose(state_after(MODEL, passed=0), Offer(4, 3, just_ahead), 4, model_lag=0).drafter == NGRAM
    behind = max(r / 100 for r in range(1, 100) if ngram(r / 100) * 1.05 < model)  # the model 5% ahead
    assert policy.choose(state_after(NGRAM), Offer(4, 3, behind), 4, model_lag=0).drafter == MODEL
    costly = state_after(MODEL)  # a model that no longer pays is left for no draft at once
    costly.model_token_s = 2.0 * STEP_S
    assert policy.choose(costly, None, 4, model_lag=0).drafter == NONE


def test_the_model_is_left_for_no_draft_only_for_a_clear_lead():
    """A model that pays a little trades places with plain steps on one round's evidence: after a model round, no
    draft must lead by PLAIN_MARGIN to take over, whatever that round passed; from no draft, the model must lead."""
    def state_after(last: str, c: float, passed: int = 0) -> PolicyState:
        state = machine(c=c)
        state.model_rounds, state.last_used[MODEL] = policy.FIRST_TRIES, 0
        for _ in range(10):
            model_round(state, 2, 1, c=c)
        model_round(state, 2, passed, c=c)
        state.last_drafter = last
        return state

    def model(c: float) -> float:  # the model's estimate over plain's: a plain step is 1 token at 1 step here
        return max(ch.speedup for ch in policy.model_options(state_after(MODEL, c), 4, 0))

    cs = [i / 100 for i in range(1, 300)]
    trailing = next(c for c in cs if model(c) < 1 / (1 + policy.PLAIN_MARGIN / 2))  # plain ahead by ~half the margin
    assert model(trailing) * (1 + policy.PLAIN_MARGIN) > 1
    ch = policy.choose(state_after(MODEL, trailing), None, 4, model_lag=0)
    assert ch.drafter == MODEL, ch
    assert f"kept: no draft ahead by less than {policy.PLAIN_MARGIN:.0%}" in ch.reason, ch
    assert policy.choose(state_after(MODEL, trailing, passed=2), None, 4, model_lag=0).drafter == MODEL
    # no margin from no draft (rounds that all commit alike, so no uncertainty either: see the test after this one)
    assert policy.choose(state_after(NONE, trailing, passed=1), None, 4, model_lag=0).drafter == NONE
    far = next(c for c in cs if model(c) * (1 + policy.PLAIN_MARGIN) < 0.98)  # plain ahead by more than the margin
    assert policy.choose(state_after(MODEL, far), None, 4, model_lag=0).drafter == NONE


def test_a_model_just_under_plain_on_uneven_rounds_drafts_again():
    """Rounds that commit 1 or 3 tokens by turns put the model a little under plain: their mean is uncertain by one
    standard deviation (1 token) over the square root of the rounds behind it, so from no draft the model drafts again,
    saying why; the same mean from rounds that all commit 2 is certain, and so is a model well under plain."""
    def state_after(committed: list[int], c: float) -> PolicyState:
        state = machine(c=c)
        state.model_stops = True
        state.model_rounds, state.last_used[MODEL] = policy.FIRST_TRIES, 0
        for n in committed:
            policy.observe_model(state, 2, n - 1, 2 * c * STEP_S, STEP_S * 1.05, ceiling=4)  # the draft stopped at 2
        state.last_drafter = NONE
        return state

    uneven, even = [1, 3] * 6, [2] * 12

    def model(c: float) -> float:  # over plain's 1 token a step
        state = state_after(even, c)
        return policy.pick_model(state, policy.model_options(state, 4, 0))[0].speedup

    cs = [i / 100 for i in range(1, 300)]
    near = next(c for c in cs if model(c) < 0.95)  # plain ahead by 5%
    assert state_after(uneven, near).round_spread() == pytest.approx(1.0, abs=0.05)
    assert state_after(even, near).round_spread() == 0.0
    ch = policy.choose(state_after(uneven, near), None, 4, model_lag=0)
    assert ch.drafter == MODEL and ch.reason.startswith("model (uncertain: 0.9"), ch
    assert policy.choose(state_after(even, near), None, 4, model_lag=0).drafter == NONE
    far = next(c for c in cs if model(c) < 0.75)  # more than a standard error under plain
    assert policy.choose(state_after(uneven, far), None, 4, model_lag=0).drafter == NONE
    # the same model far behind the text (a catch-up pass to pay first) is not re-tried on its uncertainty
    assert policy.choose(state_after(uneven, near), None, 4, model_lag=40).drafter == NONE


def test_one_preempted_round_does_not_price_the_model_out():
    """On a busy machine the scheduler can stall one drafting or one verify pass for many times its cost: the costs
    are medians, so one such round leaves the choice as it was."""
    state = machine(c=0.2)
    state.model_rounds, state.last_used[MODEL] = policy.FIRST_TRIES, 0
    for _ in range(6):
        round_costs.observe_pass(state, 5, STEP_S * 1.2)
        policy.observe_model(state, 4, 3, 4 * 0.2 * STEP_S, STEP_S * 1.2)
    before = policy.choose(state, None, 4, model_lag=0)
    round_costs.observe_pass(state, 5, STEP_S * 20)  # a stalled verify pass ...
    policy.observe_model(state, 4, 3, 4 * 0.2 * STEP_S * 30, STEP_S * 20)  # ... after a stalled draft
    after = policy.choose(state, None, 4, model_lag=0)
    assert before.drafter == after.drafter == MODEL and after.k == before.k, (before, after)
    assert state.model_c == pytest.approx(0.2, rel=0.05)


def test_c_is_each_rounds_own_ratio_so_a_slower_machine_keeps_it():
    """Draft and verify both twice as slow (a neighbour took half the cores): c, a ratio measured within each round,
    stays where it was even before the slower pass times have replaced the faster ones."""
    state = machine(c=0.25)
    for _ in range(5):
        policy.observe_model(state, 4, 4, 4 * 0.25 * STEP_S * 2, STEP_S * 1.2 * 2)
    assert state.model_c == pytest.approx(0.25, rel=0.02)


def test_a_bad_patch_relaxes_towards_the_models_long_run():
    """A model that passed ~85% for a hundred rounds meets a few rejections in a row: the policy leaves it, and
    re-tries it well before EXPLORE_EVERY rounds, since its long run says it usually pays."""
    state = machine(c=0.2)
    for r in range(100):
        model_round(state, 4, 4 if r % 7 else 1)
    state.start()
    state.model_rounds, state.last_used[MODEL] = policy.FIRST_TRIES, 0
    picks = []
    for r in range(30):
        ch = policy.choose(state, Offer(tokens=1, match=1, pass_rate=0.45), 4, model_lag=0)
        picks.append(ch.drafter)
        if ch.drafter == MODEL:
            model_round(state, ch.k, 0 if r < 4 else ch.k)  # a bad patch of four rounds, then the usual text
    left = picks.index(NGRAM)
    back = picks.index(MODEL, 4)  # the first model round after the patch
    assert left <= 4 and back - 4 < policy.EXPLORE_EVERY // 2, picks
    assert picks[back:].count(MODEL) >= len(picks[back:]) - 2, picks


def test_nothing_pays_so_nothing_is_drafted():
    """An expensive draft model that is mostly wrong and no n-gram match: a plain step, said so."""
    state = machine(c=1.0)
    state.model_rounds, state.last_used[MODEL] = policy.FIRST_TRIES, 0
    for _ in range(10):
        model_round(state, 2, 0, c=1.0)
    ch = policy.choose(state, None, 4, model_lag=0)
    assert ch.drafter == NONE and ch.k == 0
    assert ch.reason.startswith("no draft: neither drafter pays (model 0.")
    # and a hopeless n-gram offer does not pay either: each verify row costs more than it is expected to commit
    ch = policy.choose(machine(row=0.5), Offer(1, 1, 0.05), 4, model_lag=0, have_model=False)
    assert ch.drafter == NONE


def test_a_drafter_out_of_favour_is_re_tried_at_a_bounded_rate():
    state = machine(c=1.0)
    picks, reasons = [], []
    for _ in range(100):
        ch = policy.choose(state, None, 4, model_lag=0)
        picks.append(ch.drafter)
        reasons.append(ch.reason)
        if ch.drafter == MODEL:
            model_round(state, ch.k, 0, c=1.0)
    tries = [i for i, p in enumerate(picks) if p == MODEL]
    first = policy.FIRST_TRIES
    assert tries[:first] == list(range(first))  # a request's first rounds measure the model
    assert reasons[0].startswith(f"model (first tries, 1 of {first}): ")
    gaps = [b - a for a, b in zip(tries[first - 1 :], tries[first:])]
    assert len(gaps) >= 5 and all(g == policy.EXPLORE_EVERY for g in gaps), tries
    assert reasons[tries[-1]].startswith(f"model (re-try after {policy.EXPLORE_EVERY - 1} rounds unused): ")
    assert all(r.startswith("no draft: neither drafter pays") for r, p in zip(reasons, picks) if p == NONE)


def test_a_re_try_that_needs_a_catch_up_comes_as_much_less_often():
    """Far behind the text (40 ids, a catch-up pass of 2 plain steps), a re-try costs three rounds' worth: it comes
    every 3 x EXPLORE_EVERY rounds, so exploring keeps the same share of the time."""
    state = machine(c=1.0)
    round_costs.observe_catchup(state, 40, 2 * STEP_S)
    picks = []
    for _ in range(200):
        ch = policy.choose(state, None, 4, model_lag=40)
        picks.append(ch.drafter)
        if ch.drafter == MODEL:
            model_round(state, ch.k, 0, c=1.0)
    tries = [i for i, p in enumerate(picks) if p == MODEL]
    gaps = [b - a for a, b in zip(tries[policy.FIRST_TRIES - 1 :], tries[policy.FIRST_TRIES:])]
    assert round_costs.catchup_steps(state, 40) == pytest.approx(2.0)
    assert len(gaps) >= 3 and all(g == 3 * policy.EXPLORE_EVERY for g in gaps), tries


def test_a_catch_up_is_charged_to_the_model_by_the_id():
    """The same model, behind the committed text by 20 ids, then by 80 (a long run of n-gram rounds): its round costs
    its share of a catch-up pass that grows with the ids it reads, measured per id. A lag past what one round leaves
    is never free: after 60-odd n-gram rounds a re-try's catch-up took ~5.5 steps (Zen 3)."""
    state = machine()
    round_costs.observe_catchup(state, 40, 1.0 * STEP_S)  # 0.025 steps an id
    near = policy.model_options(state, 2, lag=0)
    far = policy.model_options(state, 2, lag=20)
    farther = policy.model_options(state, 2, lag=80)
    assert far[1].steps == pytest.approx(near[1].steps + 0.5 / policy.CATCHUP_ROUNDS)
    assert farther[1].steps == pytest.approx(near[1].steps + 2.0 / policy.CATCHUP_ROUNDS)
    assert round_costs.catchup_steps(state, 0) == 0.0
    fresh = machine(c=0.3)  # nothing measured: a catch-up id is priced at PRIOR_CATCHUP_ID draft tokens
    assert round_costs.catchup_steps(fresh, 60) == pytest.approx(60 * round_costs.PRIOR_CATCHUP_ID * 0.3)


def test_lagging_ids_read_with_the_first_draft_pass_are_priced_and_measured():
    """After n-gram rounds the draft model reads the text they committed with its first drafting pass: that round
    measures what a lagging id adds (not c), and the next choice charges it for the ids it will read."""
    state = machine(c=0.3)
    for _ in range(5):
        policy.observe_model(state, 2, 2, 2 * 0.3 * STEP_S, STEP_S * 1.1)
    policy.observe_model(state, 2, 2, (2 * 0.3 + 6 * 0.05) * STEP_S, STEP_S * 1.1, fed=6)
    assert state.model_c == pytest.approx(0.3) and state.fed_row == pytest.approx(0.05)
    near = policy.model_options(state, 2, lag=0)
    fed = policy.model_options(state, 2, lag=0, fed=3)  # what one round of another drafter at K 2 commits
    assert fed[1].steps == pytest.approx(near[1].steps + 3 * 0.05)
    assert "reading 3 new ids" in fed[1].reason
    # After an absence (15 rounds of plain steps) the lag past one round's is paid once, amortized as a catch-up
    away = policy.model_options(state, 2, lag=0, fed=15)
    assert away[1].steps == pytest.approx(near[1].steps + 0.05 * (3 + 12 / policy.CATCHUP_ROUNDS))


def test_a_preempted_round_reading_one_lagging_id_costs_that_id_at_most_a_draft_step():
    """The round after one of the window's plain steps reads one lagging id; preempted (4 steps for a 2-token draft),
    it must not price an id at more than a draft token (c): a wider pass that runs anyway costs no more than a pass
    of its own, and an id priced at steps kept the model out while its lag grew."""
    state = machine(c=0.3)
    for _ in range(5):
        policy.observe_model(state, 2, 2, 2 * 0.3 * STEP_S, STEP_S * 1.1)
    policy.observe_model(state, 2, 2, 4.0 * STEP_S, STEP_S * 1.1, fed=1)
    assert state.fed_row == pytest.approx(0.3)
    assert state.model_c == pytest.approx(0.3)  # a fed round measures no c


def test_k_follows_acceptance_within_the_ceiling():
    low, high = machine(), machine()
    for _ in range(20):
        model_round(low, 4, 0)
        model_round(high, 4, 4)
    k_low = max(policy.model_options(low, 8, 0), key=lambda c: c.speedup).k
    k_high = max(policy.model_options(high, 8, 0), key=lambda c: c.speedup).k
    assert k_low < k_high <= 8


# --- through the real engine ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine():
    return tiny_engine()


@pytest.mark.parametrize("k", [1, 4])
def test_greedy_output_is_plain_with_the_policy_on(engine, k):
    greedy = SamplingParams(temperature=0.0, max_new_tokens=40)
    for messages in PROMPTS:
        prompt = engine.encode_chat(messages)
        engine.reset()
        plain = run(engine, prompt, greedy, SpecParams(enabled=False))
        engine.reset()
        events = list(engine.generate(prompt, greedy, SpecParams(k=k, drafter="hybrid", stop_below=0.7)))
        assert events[-1].token_ids == plain.token_ids, messages
        rounds = [e for e in events if isinstance(e, RoundEvent)]
        assert rounds[0].drafter == "model" and "(first tries, 1 of 3)" in rounds[0].reason
        for e in rounds:
            if e.drafted:
                assert e.reason.startswith(f"{e.drafter}"), e.reason
            elif e.mode == "speculative":
                assert e.reason.startswith("no draft"), e.reason


def scripted(order: list[str]):
    """A policy that cycles through `order` (the n-gram lookup only when it has an offer), so n-gram, model and
    empty rounds interleave whatever the costs: the model's cache catches up on text it did not draft."""
    def choose(state, offer, k_max, model_lag, have_model=True, model_fed=0):
        state.round += 1
        want = order[(state.round - 1) % len(order)]
        if want == NGRAM and offer is None:
            want = MODEL
        k = {MODEL: k_max, NGRAM: offer.tokens if offer else 0, NONE: 0}[want]
        return Choice(want, k, 1.0, 1.0, f"{want}: scripted")
    return choose


def test_greedy_output_is_plain_when_the_policy_mixes_drafters(engine, monkeypatch):
    monkeypatch.setattr(policy, "choose", scripted([NGRAM, MODEL, NONE, NGRAM, NGRAM, MODEL]))
    greedy = SamplingParams(temperature=0.0, max_new_tokens=40)
    kinds: dict[str, int] = {}
    for messages in PROMPTS:
        prompt = engine.encode_chat(messages)
        engine.reset()
        plain = run(engine, prompt, greedy, SpecParams(enabled=False))
        engine.reset()
        events = list(engine.generate(prompt, greedy, SpecParams(k=3, drafter="hybrid")))
        assert events[-1].token_ids == plain.token_ids, messages
        for e in events[:-1]:
            if e.mode == "plain":  # no room left for a draft: the engine decoded the last token itself
                continue
            kind = e.drafter if e.drafted else "none"
            kinds[kind] = kinds.get(kind, 0) + 1
            assert e.reason == f"{kind}: scripted"
    assert min(kinds.get(x, 0) for x in ("model", "ngram", "none")) >= 5, kinds


def test_sampling_is_exact_with_the_policy_on():
    """The real policy: its first round is the draft model's (so the checks of the model's first draft apply),
    later ones whatever the measured costs say."""
    assert_exact_distribution(*small_pair(), "model", 1.0, 1.0, SpecParams(k=2, drafter="hybrid"))


def test_sampling_is_exact_when_the_policy_switches_drafters(monkeypatch):
    """The n-gram lookup drafts the first round, the model (after catching up on the correction) the next."""
    monkeypatch.setattr(policy, "choose", scripted([NGRAM, MODEL]))
    assert_exact_distribution(*small_pair(), "ngram", 1.0, 1.0, SpecParams(k=1, drafter="hybrid"))


# --- the benchmark's decode rate --------------------------------------------------------------------------------


def _round(n: int, prefill_ms: float) -> RoundEvent:
    return RoundEvent(round=n, mode="speculative", drafter="model", k=1, temperature=0.0,
                      drafted=(DraftToken(5, "x", 0.5, 0.5, True),), committed=(), text_delta="", draft_ms=1.0,
                      verify_ms=2.0, elapsed_s=0.0, new_tokens=n, draft_prefill_ms=prefill_ms)


def test_the_decode_rate_keeps_the_draft_models_catch_ups():
    """The draft model's first prefill of a reply is the prompt's (left out, as the target's is); a later catch-up
    on text the n-gram rounds committed is a cost of decoding."""
    events = [_round(1, 300.0), _round(2, 0.0), _round(3, 40.0), _round(4, 60.0)]
    s = Summary(new_tokens=10, rounds=4, target_forwards=5, drafted=4, accepted=4, acceptance_rate=1.0,
                mean_tokens_per_round=2.5, per_position_acceptance=(1.0,), tokens_per_s=0.0, ttft_s=0.0, total_s=2.0,
                prompt_tokens=50, reused_prefix_tokens=0, draft_ms=4.0, verify_ms=8.0, stop_reason="length", text="",
                prefill_s=0.5, draft_prefill_ms=400.0)
    assert decode_seconds(events, s) == pytest.approx(2.0 - 0.5 - 0.3)
    t = Tally()
    t.add(events, s)
    assert t.tokens_per_s == pytest.approx(10 / 1.2)


def test_an_unseen_match_length_borrows_the_texts_pass_rate():
    """A rare long match does not start at the optimistic 1/2 the n-gram drafter's own rule uses: the hybrid's
    offer prices it at what the text's other lookups passed."""
    import torch

    from engine.spec.drafters import NGramDrafter

    ngram = NGramDrafter(vocab=16, device=torch.device("cpu"))
    ngram.hits, ngram.trials = {1: 2.0}, {1: 20.0}  # short matches pass 10% of the time
    assert ngram.pass_rate(4) == 0.5
    assert ngram.pooled_pass_rate(4) == pytest.approx(3 / 22)
    ngram.hits[4], ngram.trials[4] = 90.0, 100.0
    assert ngram.pooled_pass_rate(4) == pytest.approx((90 + 2 * 93 / 122) / 102)


def test_step_through_says_why_each_round_drafted(engine):
    """Every phase of a stepped round carries the reason its RoundEvent records."""
    from tests.engine.test_stepping import stepping_controls

    greedy = SamplingParams(temperature=0.0, max_new_tokens=12)
    spec = SpecParams(k=3, drafter="hybrid")
    controls, seen = stepping_controls(greedy, spec)
    engine.reset()
    prompt = engine.encode_chat(PROMPTS[2])
    rounds = {e.round: e for e in engine.generate(prompt, greedy, spec, controls) if isinstance(e, RoundEvent)}
    assert seen
    for ph in seen:
        assert ph.reason == rounds[ph.round].reason
    assert any(ph.reason.startswith("model (first tries") for ph in seen)


def test_a_sampled_reply_is_reproducible_from_its_seed(engine):
    """Under sampling the policy reads no timing of its own, so the same seed makes the same choices and the same
    reply, before and after a greedy reply has measured the costs; the greedy reply did measure them."""
    sampled = SamplingParams(temperature=0.9, top_p=0.95, seed=7, max_new_tokens=30)
    spec = SpecParams(k=3, drafter="hybrid")
    prompt = engine.encode_chat(PROMPTS[1])

    def reply(params):
        engine.reset()
        events = list(engine.generate(prompt, params, spec))
        return events[-1].token_ids, [e.reason for e in events[:-1]]

    state = engine.hybrid_drafter.state
    first = reply(sampled)
    costs = ((state.level_s, state.shape), state.model_token_s, state.catchup_id_s, state.lookup_s, state.prior_alpha)
    assert reply(sampled) == first
    assert ((state.level_s, state.shape), state.model_token_s, state.catchup_id_s, state.lookup_s, state.prior_alpha) == costs
    reply(SamplingParams(temperature=0.0, max_new_tokens=30))
    assert (state.level_s, state.shape) != costs[0]  # greedy rounds measured the passes
    moved = (state.level_s, state.shape)
    again = reply(sampled)
    assert (state.level_s, state.shape) == moved
    assert again[0] and all(r for r in again[1][:3])


def test_the_first_tries_draft_at_the_ceiling():
    state = machine(c=2.0)  # the model does not pay: only the first tries draft with it
    picks = [policy.choose(state, None, 5, model_lag=0) for _ in range(policy.FIRST_TRIES + 1)]
    assert [(p.drafter, p.k) for p in picks] == [(MODEL, 5)] * policy.FIRST_TRIES + [(NONE, 0)]


def test_a_load_that_changes_between_widths_leaves_the_pass_shape():
    """Width-5 passes measured while a neighbour made the machine three times slower, then widths 1 and 3 once it had
    gone: the shape (what a row adds) is the kernels', t(w) = t(1) (1 + 0.1 (w - 1)), not the load's."""
    state = PolicyState()
    for _ in range(9):
        round_costs.observe_pass(state, 5, 3 * STEP_S * 1.4)
    assert state.shape == ()  # one width alone says nothing about what a row adds
    for _ in range(9):
        round_costs.observe_pass(state, 1, STEP_S)
        round_costs.observe_pass(state, 3, STEP_S * 1.2)
        round_costs.observe_pass(state, 5, STEP_S * 1.4)
    steps, step_s = round_costs.pass_steps(state, 5)
    assert steps == pytest.approx(1.4, rel=0.05) and step_s == pytest.approx(STEP_S, rel=0.05)


def test_a_stalled_pass_beside_a_quick_one_does_not_make_rows_free():
    """On a 2-core machine with one core busy some passes are preempted and some not: a stalled 1-row pass between
    two quick 5-row ones would read as rows that cost nothing, and such pairs once priced a 5-row n-gram pass at one
    step (the hybrid then took 11 failing n-gram rounds in a row). A pass far from the level's prediction measures no
    shape."""
    state = PolicyState()
    quick5, stalled1 = STEP_S * (1 + 4 * round_costs.PRIOR_ROW), 3 * STEP_S
    for w, t in ((5, quick5), (1, stalled1), (5, quick5)):
        round_costs.observe_pass(state, w, t)
    assert not any(name.startswith("widths") for name in state.recent) and state.shape == ()  # both had it in
    assert round_costs.pass_steps(state, 5)[0] == pytest.approx(1 + 4 * round_costs.PRIOR_ROW)
    round_costs.observe_pass(state, 1, STEP_S * 1.4)  # slower than the quick passes, not stalled ...
    round_costs.observe_pass(state, 5, quick5)  # ... and with the next pass, a pair: 5 rows cost 1.14 steps
    assert round_costs.pass_steps(state, 5)[0] == pytest.approx(1.6 / 1.4)
    ngram = policy.ngram_options(state, policy.Offer(tokens=4, match=2, pass_rate=0.45))
    assert ngram and all(ch.steps >= 1.0 + 0.03 * ch.k for ch in ngram)


def test_a_pass_shape_that_is_no_line_is_measured_width_by_width():
    """Zen 3 in a quiet hour: the second row added 0.44 of a step and the fifth 0.21. Model rounds pass 2-5 rows
    and a line through them misses t(1) by 13%; one plain step beside them puts every width and the level right,
    and widths past the widest measured go on at its mean row."""
    truth = (1.0, 1.44, 1.75, 2.20, 2.41)
    state = PolicyState()
    widths = [2, 3, 2, 5, 4, 2, 3, 5, 3, 4, 2, 5]
    for w in widths:
        round_costs.observe_pass(state, w, STEP_S * truth[w - 1])
    assert state.shape[1:] != pytest.approx(truth[1:], rel=0.02)  # the prior joins width 1: 2 rows cost 1.15
    for w in (1, 2, 1, 4):
        round_costs.observe_pass(state, w, STEP_S * truth[w - 1])
    assert state.shape == pytest.approx(truth)
    assert round_costs.pass_steps(state, 2.5)[0] == pytest.approx((1.44 + 1.75) / 2)
    assert round_costs.pass_steps(state, 7)[0] == pytest.approx(2.41 + 2 * 1.41 / 4)
    assert state.level_s == pytest.approx(STEP_S)


def test_a_plain_step_is_taken_to_measure_plain_while_drafts_win_every_round():
    """The model wins every round, so no plain step would measure t(1) beside the drafts' wider passes: one is taken
    at most PROBE_EVERY passes after the last plain step beside a draft (the machine's own, at its start), and says
    why; the next comes PROBE_EVERY passes after the pass that followed it, which made the last such pair. Under
    sampling none is (a choice from the reply's own timings would change what a seed draws)."""
    state = machine(row=0.3, c=0.2)
    state.model_rounds, state.last_used[MODEL] = policy.FIRST_TRIES, 0
    picks = []
    for _ in range(3 * policy.PROBE_EVERY):
        ch = policy.choose(state, None, 4, model_lag=0)
        picks.append(ch)
        width = ch.k + 1 if ch.drafter == MODEL else 1
        round_costs.observe_pass(state, width, STEP_S * (1 + 0.3 * (width - 1)))
        if ch.drafter == MODEL:
            policy.observe_model(state, ch.k, ch.k, ch.k * 0.2 * STEP_S, STEP_S * (1 + 0.3 * ch.k))
    probes = [i for i, ch in enumerate(picks) if ch.drafter == NONE]
    assert probes[0] < policy.PROBE_EVERY and len(probes) == 3, probes
    assert all(b - a == policy.PROBE_EVERY + 1 for a, b in pairwise(probes)), probes
    assert picks[probes[0]].reason.startswith("no draft: a plain step beside the drafts measures"), picks[probes[0]]
    state.measuring = False
    assert all(policy.choose(state, None, 4, model_lag=0).drafter == MODEL for _ in range(2 * policy.PROBE_EVERY))


def test_under_the_stop_rule_a_model_round_is_priced_by_what_rounds_really_made():
    """With the draft's confidence rule on, the model drafts up to the ceiling and stops when unsure, so the policy
    prices its round from what model rounds drafted and committed, not from alpha at each K: rounds that draft ~3
    and commit ~3.5 beat plain and a weak n-gram offer; rounds that draft 1 and commit 1 lose to plain."""
    good, bad = machine(c=0.2), machine(c=0.2)
    for state in (good, bad):
        state.model_stops = True
        state.model_rounds, state.last_used[MODEL] = policy.FIRST_TRIES, 0
    for r in range(12):
        policy.observe_model(good, 3, 3 if r % 2 else 2, 3 * 0.2 * STEP_S, STEP_S * 1.15, ceiling=4)
        policy.observe_model(bad, 1, 0, 0.2 * STEP_S, STEP_S * 1.05, ceiling=4)
    ch = policy.choose(good, Offer(tokens=1, match=1, pass_rate=0.3), 4, model_lag=0)
    assert ch.drafter == MODEL and "stops when unsure" in ch.reason, ch
    top = policy.model_options(good, 4, 0)[-1]  # K <= 4: what the rounds at that ceiling made
    assert top.tokens == pytest.approx(3.4, abs=0.3) and top.reason.startswith("K \u2264 4"), top
    ch = policy.choose(bad, None, 4, model_lag=0)
    assert ch.drafter == NONE, ch


def test_under_the_stop_rule_the_ceiling_drops_where_late_drafts_fail():
    """Rows and drafted tokens a third of a step each (as on a 2-core Zen 3): rounds whose draft runs to 4 but passes
    only its first 2 commit 3 tokens either way, so a ceiling of 2 makes them in fewer steps and the policy drafts
    at K <= 2, saying so; rounds whose 4 drafts all pass keep the ceiling at 4."""
    def after(accepted: int) -> PolicyState:
        state = machine(row=0.33, c=0.33)
        state.model_stops = True
        state.model_rounds, state.last_used[MODEL] = policy.FIRST_TRIES, 0
        for _ in range(12):
            policy.observe_model(state, 4, accepted, 4 * 0.33 * STEP_S, STEP_S * (1 + 0.33 * 4), ceiling=4)
        return state

    ch = policy.choose(after(2), None, 4, model_lag=0)
    assert ch.drafter == MODEL and ch.k == 2 and "K \u2264 2 (stops when unsure)" in ch.reason, ch
    assert ch.tokens == pytest.approx(3.0, abs=0.1)
    ch = policy.choose(after(4), None, 4, model_lag=0)
    assert ch.drafter == MODEL and ch.k == 4, ch
    state = after(1)  # only the first draft passes: K <= 1 would be the cheapest ...
    ks = policy.model_options(state, 4, 0)
    assert ks[0].speedup > ks[1].speedup > ks[3].speedup
    assert policy.pick_model(state, ks)[0].k == policy.MIN_CEILING == 2  # ... but the ceiling stays at 2 or more


def test_under_the_stop_rule_k2_is_home_and_the_top_drafts_once_in_top_every(monkeypatch):
    """The draft model keeps K <= 2 unless a higher ceiling is CEILING_MARGIN ahead: where a third of the rounds stop
    passing after 2 of 4 drafts the top is 3% ahead and K 2 stays, one model round in TOP_EVERY drafting at the top so
    that its late positions stay measured; where every draft passes the top leads by 24% and is taken. With the
    home at the top (CEILING_HOME = 0) the near tie goes to the top."""
    def after(row: float, pattern: list[int]) -> PolicyState:
        state = machine(row=row, c=0.2)
        state.model_stops = True
        state.model_rounds, state.last_used[MODEL] = policy.FIRST_TRIES, 0
        for r in range(12):
            a = pattern[r % len(pattern)]
            policy.observe_model(state, 4, a, 4 * 0.2 * STEP_S, STEP_S * (1 + row * 4), ceiling=4)
        return state

    near = after(0.1, [4, 4, 2])
    ks = policy.model_options(near, 4, 0)
    assert 1.0 < ks[3].speedup / ks[1].speedup < 1 + policy.CEILING_MARGIN
    picks = [policy.choose(near, None, 4, model_lag=0) for _ in range(2 * policy.TOP_EVERY)]
    assert [p.k for p in picks] == ([2] * (policy.TOP_EVERY - 1) + [4]) * 2
    assert "at the ceiling once in" in picks[policy.TOP_EVERY - 1].reason
    assert policy.choose(after(0.05, [4]), None, 4, model_lag=0).k == 4
    monkeypatch.setattr(policy, "CEILING_HOME", 0)
    assert policy.choose(after(0.1, [4, 4, 2]), None, 4, model_lag=0).k == 4


def test_the_verify_pass_is_priced_over_the_draft_lengths():
    """Passes whose fourth row costs more than the first three (as on Zen 3: 1.20 plain steps for 3 rows, 1.56 for 4)
    and rounds at ceiling 4 that draft 1 token or 4, half each: they pay half a 2-row pass and half a 5-row one,
    more than the pass at their mean width, which the straight line between 3 and 4 rows would price."""
    shape = {1: 1.0, 2: 1.1, 3: 1.2, 4: 1.6, 5: 1.9}
    state = PolicyState()
    for _ in range(3):
        for w in range(1, 6):
            round_costs.observe_pass(state, w, STEP_S * shape[w])
    assert state.shape == pytest.approx(tuple(shape.values()), rel=1e-3)
    state.model_stops = True
    for r in range(20):
        d = 1 if r % 2 else 4
        policy.observe_model(state, d, d, 0.25 * d * STEP_S, STEP_S * shape[d + 1], ceiling=4)
    forecast = state.model_round(4)
    chances = dict(forecast.length_chances())
    assert chances[1] == pytest.approx(0.5, abs=0.05) and chances[1] + chances[4] > 0.9  # the priors blur it a little
    intercept, per_token = state.draft_line
    verify = policy.model_options(state, 4, 0)[3].steps - (intercept + per_token * forecast.drafted)
    assert verify == pytest.approx(sum(p * shape[d + 1] for d, p in chances.items()), rel=1e-3)
    assert verify > round_costs.pass_steps(state, forecast.drafted + 1)[0] + 0.05


def test_a_draft_is_priced_by_a_line_through_its_measured_lengths():
    """Each draft costs a fixed 0.1 step besides 0.25 a token: once two lengths are measured, the policy's line has
    that intercept and slope, so a 1-token draft is priced at 0.35 steps and a 4-token one at 1.1, where a median
    cost per token would price both alike."""
    state = machine(row=0.2)
    state.model_stops = True
    for d in (1, 4, 1, 4, 2):
        policy.observe_model(state, d, d, (0.1 + 0.25 * d) * STEP_S, STEP_S * (1 + 0.2 * d), ceiling=4)
    assert state.draft_line == pytest.approx((0.1, 0.25), abs=1e-6)


def test_an_offer_that_passes_whole_once_begun_is_taken_whole():
    """A copied span: the first token passes one time in two, the rest follow it. Priced as pass_rate^i the later
    rows are not worth their cost; priced by the measured chain the whole offer is."""
    state = machine(row=0.3)
    geometric = Offer(tokens=4, match=1, pass_rate=0.6)
    copied = Offer(tokens=4, match=1, pass_rate=0.6, chain=(0.55, 0.52, 0.5, 0.48))
    assert copied.passing(4) == pytest.approx(2.05) and geometric.passing(2) == pytest.approx(0.96)
    ch = policy.choose(state, geometric, 4, model_lag=0, have_model=False)
    assert ch.drafter == NGRAM and ch.k < 4, ch
    ch = policy.choose(state, copied, 4, model_lag=0, have_model=False)
    assert ch.drafter == NGRAM and ch.k == 4 and "all 4 pass 0.48" in ch.reason, ch


def test_without_first_tries_a_model_priced_out_is_re_tried_after_the_usual_wait(monkeypatch):
    """policy_ab --set FIRST_TRIES=0: a model that has not drafted in this request and whose long run prices it under
    plain waits EXPLORE_EVERY rounds like any model out of favour, then drafts one round."""
    monkeypatch.setattr(policy, "FIRST_TRIES", 0)
    state = machine()
    state.model_stops = True
    for _ in range(10):  # earlier requests: 1 token a round for 2 drafted
        policy.observe_model(state, 2, 0, 2 * 0.3 * STEP_S, STEP_S * 1.1, ceiling=4)
    state.start()
    picks = [policy.choose(state, None, 4, 0) for _ in range(policy.EXPLORE_EVERY)]
    assert [p.drafter for p in picks] == [NONE] * (policy.EXPLORE_EVERY - 1) + [MODEL]
    assert "re-try" in picks[-1].reason
