"""Mid-request controls: K, temperature, the speculation toggle and the drafter change between rounds;
cancel and closing the generator leave the engine ready for the next request; adaptive K."""
from __future__ import annotations

import random
import time

import pytest
import torch

from engine.analysis.theory import theoretical_speedup
from engine.api.config import SamplingParams, SpecParams
from engine.api.events import Origin, RoundEvent, Summary
from engine.api.live import PLAIN_FIRST, PLAIN_RUN, plain_step_due
from engine.runtime.engine import Controls, Engine
from engine.spec.adaptive import AdaptiveK
from tests.tiny import tiny_engine

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=40)
SPEC = SpecParams(k=4)
MESSAGES = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def engine() -> Engine:
    return tiny_engine()


@pytest.fixture(scope="module")
def prompt(engine) -> list[int]:
    return engine.encode_chat(MESSAGES)


@pytest.fixture(scope="module")
def plain(engine, prompt) -> Summary:
    """Plain greedy decoding: the reference every greedy variant must reproduce token for token."""
    engine.reset()
    *_, s = engine.generate(prompt, GREEDY, SpecParams(enabled=False))
    assert s.new_tokens == 40
    return s


def assert_consistent(engine: Engine) -> None:
    assert engine.target_pool.manager.length(0) == len(engine.ids) - 1
    d = engine.model_drafter
    assert engine.ids[: len(d.cached)] == d.cached
    assert d.pool.manager.length(0) == len(d.cached)
    assert len(d.cached) <= len(engine.ids) - 1


def drive(engine, prompt, sampling, spec, controls, on_round) -> tuple[list[RoundEvent], Summary]:
    """Iterate generate(); after each RoundEvent call on_round(event) (which may change controls)."""
    events = []
    for item in engine.generate(prompt, sampling, spec, controls):
        if isinstance(item, Summary):
            return events, item
        events.append(item)
        on_round(item)
    raise AssertionError("no Summary")


def test_k_temperature_and_toggle_change_between_rounds(engine, prompt, monkeypatch):
    engine.reset()
    # Rounds 2-7 sample at T = 0.8 from random tiny weights: without EOS the reply runs to its length budget
    # whatever is drawn, which is what the last rounds check.
    monkeypatch.setattr(engine, "eos_ids", set())
    sampling = GREEDY.with_(seed=3)
    controls = Controls(sampling, SPEC)

    def on_round(ev):
        if ev.round == 2:
            controls.spec = SPEC.with_(k=2)
            # The request's length budget, seed and stops win over a per-round sampling change.
            controls.sampling = SamplingParams(temperature=0.8, top_k=20, max_new_tokens=1000)
        elif ev.round == 5:
            controls.spec = SPEC.with_(enabled=False)
        elif ev.round == 8:
            controls.spec = SPEC.with_(k=3, drafter="ngram")
            controls.sampling = SamplingParams(temperature=0.0)

    events, summary = drive(engine, prompt, sampling, SPEC, controls, on_round)
    assert len(events) > 9
    for ev in events[:2]:
        assert (ev.mode, ev.drafter, ev.k, ev.temperature) == ("speculative", "model", 4, 0.0)
        assert len(ev.drafted) == 4
    for ev in events[2:5]:
        assert (ev.mode, ev.drafter, ev.k, ev.temperature) == ("speculative", "model", 2, 0.8)
        assert len(ev.drafted) == 2
    for ev in events[5:8]:
        assert (ev.mode, ev.drafter, ev.k, ev.temperature) == ("plain", None, 0, 0.8)
        assert ev.drafted == () and len(ev.committed) == 1 and ev.committed[0].origin is Origin.PLAIN
    for ev in events[8:]:
        assert ev.temperature == 0.0
        left = 40 - (ev.new_tokens - len(ev.committed))
        if left > 1:
            assert ev.mode == "speculative" and ev.drafter == "ngram" and ev.k == min(3, left - 1)
        else:  # the budget leaves room for one token only: a plain step
            assert ev.mode == "plain" and ev.k == 0
    assert summary.new_tokens == 40 and summary.stop_reason == "length"
    assert_consistent(engine)


@pytest.mark.parametrize("switch_at", [1, 2, 4])
def test_speculation_off_mid_request_greedy_matches_plain(engine, prompt, plain, switch_at):
    engine.reset()
    controls = Controls(GREEDY, SPEC)

    def on_round(ev):
        if ev.round == switch_at:
            controls.spec = SPEC.with_(enabled=False)

    events, summary = drive(engine, prompt, GREEDY, SPEC, controls, on_round)
    assert [e.mode for e in events[:switch_at]] == ["speculative"] * switch_at
    assert all(e.mode == "plain" for e in events[switch_at:])
    assert summary.token_ids == plain.token_ids
    assert summary.text == plain.text
    assert_consistent(engine)


def test_switching_drafter_mid_request(engine, prompt, plain):
    engine.reset()
    controls = Controls(GREEDY, SPEC)
    plan = {2: "ngram", 4: "model", 6: "ngram", 8: "model"}

    def on_round(ev):
        if ev.round in plan:
            controls.spec = SPEC.with_(drafter=plan[ev.round])
        assert_consistent(engine)

    events, summary = drive(engine, prompt, GREEDY, SPEC, controls, on_round)
    names = [e.drafter for e in events]
    assert names[:2] == ["model", "model"]
    assert names[2:4] == ["ngram", "ngram"]
    assert names[4:6] == ["model", "model"]
    assert summary.token_ids == plain.token_ids  # lossless whichever drafter proposes
    assert_consistent(engine)


def test_sampled_request_with_mid_request_changes_is_reproducible(engine, prompt):
    """Same seed, same control changes at the same rounds: the same reply."""
    outs = []
    for _ in range(2):
        engine.reset()
        sampling = SamplingParams(temperature=1.0, max_new_tokens=30, seed=11)
        controls = Controls(sampling, SPEC)

        def on_round(ev):
            if ev.round == 3:
                controls.spec = SPEC.with_(k=2, drafter="ngram")
                controls.sampling = sampling.with_(temperature=0.5)

        _, s = drive(engine, prompt, sampling, SPEC, controls, on_round)
        outs.append(s.token_ids)
    assert outs[0] == outs[1]


def test_cancel_stops_before_the_next_round(engine, prompt, plain):
    engine.reset()
    controls = Controls(GREEDY, SPEC)

    def on_round(ev):
        if ev.round == 2:
            controls.cancel()

    events, summary = drive(engine, prompt, GREEDY, SPEC, controls, on_round)
    assert len(events) == 2
    assert summary.stop_reason == "cancelled" and summary.rounds == 2
    assert summary.new_tokens == sum(len(e.committed) for e in events) < 40
    assert summary.token_ids == plain.token_ids[: summary.new_tokens]
    assert summary.text == "".join(e.text_delta for e in events)
    assert_consistent(engine)
    # The next request on the same engine is unaffected.
    *_, again = engine.generate(prompt, GREEDY, SPEC)
    assert again.token_ids == plain.token_ids


def test_cancel_during_a_round_finishes_that_round_only(engine, prompt, plain):
    engine.reset()
    controls = Controls(GREEDY, SPEC)
    drafter = engine.model_drafter
    original = drafter.propose
    calls = []

    def propose(*args, **kw):  # a GUI thread pressing Stop while round 3 drafts
        calls.append(1)
        if len(calls) == 3:
            controls.cancel()
        return original(*args, **kw)

    drafter.propose = propose
    try:
        events, summary = drive(engine, prompt, GREEDY, SPEC, controls, lambda ev: None)
    finally:
        del drafter.propose
    assert len(events) == 3 and len(calls) == 3
    assert events[-1].stop_reason is None  # the round itself completed normally
    assert summary.stop_reason == "cancelled"
    assert summary.token_ids == plain.token_ids[: summary.new_tokens]
    assert_consistent(engine)


def test_cancel_before_the_first_round(engine, prompt):
    engine.reset()
    controls = Controls(GREEDY, SPEC)
    controls.cancel()
    events, summary = drive(engine, prompt, GREEDY, SPEC, controls, lambda ev: None)
    assert events == []
    assert (summary.stop_reason, summary.rounds, summary.new_tokens, summary.text) == ("cancelled", 0, 0, "")
    assert engine.ids == prompt
    assert_consistent(engine)


def test_cancel_during_a_long_prefill_stops_between_its_chunks(engine, prompt, plain, monkeypatch):
    """A cancel waited out the whole prefill of a long prompt (~25 s on the embedded pair)."""
    import engine.model.forward as fwd

    monkeypatch.setattr(fwd, "PREFILL_CHUNK", 4)
    engine.reset()
    controls = Controls(GREEDY, SPEC)
    calls = []
    real = engine.target.forward

    def forward(*args, **kwargs):  # the cancel arrives while the first chunk runs
        calls.append(1)
        controls.cancel()
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.target, "forward", forward)
    events, summary = drive(engine, prompt, GREEDY, SPEC, controls, lambda ev: None)
    assert len(calls) == 1 < (len(prompt) - 1) // 4  # one chunk of many
    assert events == [] and (summary.stop_reason, summary.new_tokens) == ("cancelled", 0)
    assert engine.ids == prompt[:5] and engine.target_pool.manager.length(0) == 4
    monkeypatch.undo()
    *_, again = engine.generate(prompt, GREEDY, SpecParams(enabled=False))  # the chunk done is reused
    assert again.reused_prefix_tokens == 4 and again.token_ids == plain.token_ids
    assert_consistent(engine)


def test_cancel_during_the_draft_models_prefill_stops_between_its_chunks(engine, prompt, plain, monkeypatch):
    """The draft model's lazy prefill of the prompt (round 1) also ran to its end first."""
    import engine.model.forward as fwd

    monkeypatch.setattr(fwd, "PREFILL_CHUNK", 4)
    engine.reset()
    controls = Controls(GREEDY, SPEC)
    calls = []
    real = engine.draft.forward

    def forward(*args, **kwargs):  # the cancel arrives while the draft's first chunk runs
        calls.append(1)
        controls.cancel()
        return real(*args, **kwargs)

    monkeypatch.setattr(engine.draft, "forward", forward)
    events, summary = drive(engine, prompt, GREEDY, SPEC, controls, lambda ev: None)
    assert len(calls) == 1 and events == [] and (summary.stop_reason, summary.new_tokens) == ("cancelled", 0)
    assert engine.model_drafter.cached == prompt[:4]  # the chunk done stays
    assert_consistent(engine)
    monkeypatch.undo()
    *_, again = engine.generate(prompt, GREEDY, SPEC)
    assert again.token_ids == plain.token_ids
    assert_consistent(engine)


@pytest.mark.parametrize("close_after", [1, 3])
def test_closing_the_generator_leaves_caches_consistent(engine, prompt, plain, close_after):
    engine.reset()
    gen = engine.generate(prompt, GREEDY, SPEC)
    committed = 0
    for _ in range(close_after):
        ev = next(gen)
        assert isinstance(ev, RoundEvent)
        committed += len(ev.committed)
    gen.close()
    assert engine.ids == prompt + list(plain.token_ids[:committed])
    assert_consistent(engine)
    # The next request works and matches a fresh engine, both on the same prompt and on a new one.
    *_, again = engine.generate(prompt, GREEDY, SPEC)
    assert again.token_ids == plain.token_ids
    assert again.reused_prefix_tokens == len(prompt) - 1
    other = engine.encode_chat([{"role": "user", "content": "hello again"}])
    *_, s_other = engine.generate(other, GREEDY.with_(max_new_tokens=20), SPEC)
    fresh = tiny_engine(draft=False)
    *_, ref = fresh.generate(other, GREEDY.with_(max_new_tokens=20), SpecParams(enabled=False))
    assert s_other.token_ids == ref.token_ids


# --- adaptive K -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "alpha,k,c,want",
    [
        (0.5, 2, 0.1, 1.75 / 1.2),
        (0.8, 4, 0.0, (1 - 0.8**5) / 0.2),
        (1.0, 4, 0.25, 5 / 2.0),
        (0.0, 3, 0.5, 1 / 2.5),
        (0.9, 1, 1.0, 1.9 / 2.0),
    ],
)
def test_expected_speedup_values(alpha, k, c, want):
    assert theoretical_speedup(alpha, k, c) == pytest.approx(want)


def test_expected_speedup_is_continuous_at_alpha_one():
    assert theoretical_speedup(0.999999, 6, 0.2) == pytest.approx(theoretical_speedup(1.0, 6, 0.2), rel=1e-4)


def test_adaptive_estimates():
    a = AdaptiveK(decay=0.8, alpha=0.6, c=0.3)
    assert a.alpha == pytest.approx(0.6)
    a.observe(drafted=4, accepted=2, draft_s_per_token=0.01, verify_s=0.02)
    # hits 2.4*0.8 + 2, trials 4*0.8 + 2 + 1 (the rejected trial)
    assert a.alpha == pytest.approx(3.92 / 6.2)
    assert a.c == pytest.approx(0.7 * 0.3 + 0.3 * 0.5)
    a.observe(drafted=3, accepted=3, draft_s_per_token=0.01, verify_s=0.0)  # all passed: no failed trial
    assert a.alpha == pytest.approx((3.92 * 0.8 + 3) / (6.2 * 0.8 + 3))
    assert a.c == pytest.approx(0.7 * 0.3 + 0.3 * 0.5)  # no verify time: cost estimate kept


def test_adaptive_k_follows_acceptance():
    spec = SpecParams(adaptive=True, k=16, k_max=16)
    a = AdaptiveK()
    for _ in range(30):  # everything accepted, cheap draft
        a.observe(8, 8, 0.001, 0.01)
    assert a.alpha == pytest.approx(0.999)
    high = a.choose(spec)
    assert high == 16
    assert a.choose(SpecParams(adaptive=True, k=2, k_max=8)) == 2  # bounded by the K the user set
    ks = []
    for _ in range(30):  # the text changes: nothing is accepted any more
        a.observe(high, 0, 0.001, 0.01)
        ks.append(a.choose(spec))
    assert ks[-1] == 1
    assert all(x >= y for x, y in zip(ks, ks[1:]))  # K falls as the estimate falls
    assert len(set(ks)) > 2  # through intermediate values, not a jump
    for _ in range(30):  # and recovers
        a.observe(4, 4, 0.001, 0.01)
    assert a.choose(spec) > 8


def test_adaptive_choice_is_the_argmax_of_the_model():
    a = AdaptiveK(alpha=0.7, c=0.2)
    spec = SpecParams(adaptive=True, k=16)
    best = max(range(1, spec.k + 1), key=lambda k: theoretical_speedup(0.7, k, 0.2))
    assert a.choose(spec) == best
    assert 1 < best < spec.k  # an interior optimum: the test means something


def test_adaptive_in_the_engine_stays_lossless(engine, prompt, plain):
    engine.reset()
    events, summary = drive(engine, prompt, GREEDY, SpecParams(adaptive=True, k_max=8), None, lambda ev: None)
    assert all(1 <= e.k <= 8 for e in events if e.mode == "speculative")
    assert summary.token_ids == plain.token_ids
    assert_consistent(engine)


def test_generate_leaves_the_global_rng_alone(engine, prompt):
    """A request without a seed must not reseed torch's global generator (torch.seed() does): code around
    the engine that seeded torch for its own reproducibility would silently lose it."""
    torch.manual_seed(1234)
    want = torch.rand(4)
    torch.manual_seed(1234)
    engine.reset()
    *_, s = engine.generate(prompt, GREEDY.with_(max_new_tokens=3), SPEC)
    assert s.new_tokens == 3
    assert torch.equal(torch.rand(4), want)


@pytest.mark.parametrize("seed", [0, 1])
def test_random_control_changes_stay_lossless_under_greedy(engine, prompt, plain, seed):
    rng = random.Random(seed)
    engine.reset()
    controls = Controls(GREEDY, SPEC)
    seen = set()

    def on_round(ev):
        seen.add((ev.mode, ev.drafter))
        assert_consistent(engine)
        controls.spec = SpecParams(
            enabled=rng.random() < 0.8, k=rng.randint(1, 8), drafter=rng.choice(["model", "ngram"]),
            adaptive=rng.random() < 0.3, k_max=8,
        )

    events, summary = drive(engine, prompt, GREEDY, SPEC, controls, on_round)
    assert summary.token_ids == plain.token_ids
    assert {("speculative", "model"), ("speculative", "ngram"), ("plain", None)} <= seen
    assert_consistent(engine)


def test_adaptive_k_measures_the_verify_width():
    """Verify passes that grow with K (quantized kernels, row-wise attention) make large K less attractive."""
    flat, wide = AdaptiveK(alpha=0.8, c=0.05), AdaptiveK(alpha=0.8, c=0.05)
    for k in (2, 4, 6, 8) * 5:
        flat.observe(k, k - 1, 0.001, 0.020)
        wide.observe(k, k - 1, 0.001, 0.020 * (1 + 0.25 * k))  # each extra row: a quarter of a step
    assert flat.w == pytest.approx(0.0, abs=1e-9)
    assert wide.w == pytest.approx(0.25, rel=1e-6)
    assert wide.c == pytest.approx(flat.c, rel=0.05)  # c is per step, whatever the width
    spec = SpecParams(adaptive=True, k=16)
    assert wide.choose(spec) < flat.choose(spec)
    assert wide.choose(spec) == max(range(1, 17), key=lambda k: theoretical_speedup(wide.alpha, k, wide.c, 0.25))


def test_plain_steps_fall_on_fixed_rounds():
    runs = [PLAIN_FIRST, PLAIN_FIRST + 16, PLAIN_FIRST + 32]
    assert [r for r in range(1, 40) if plain_step_due(r, 16)] == [s + i for s in runs for i in range(PLAIN_RUN)]
    assert [r for r in range(1, 12) if plain_step_due(r, 2)] == [5, 7, 9, 11]  # a speculative round between runs
    assert not any(plain_step_due(r, 1) for r in range(1, 40))
    assert not any(plain_step_due(r, 0) for r in range(1, 40))
    assert not any(plain_step_due(r, -3) for r in range(1, 40))


def test_plain_steps_come_in_runs_and_greedy_output_is_plains(engine, prompt, plain):
    """The window's measured speedup times runs of plain steps (Controls.plain_every); the engine runs them on the
    rounds plain_step_due names and speculation goes on after each run, and greedy output is plain's."""
    engine.reset()
    controls = Controls(GREEDY, SPEC)
    controls.plain_every = 6
    events, s = drive(engine, prompt, GREEDY, SPEC, controls, lambda ev: None)
    modes = {ev.round: ev.mode for ev in events}
    last = events[-1].round  # may be plain: the length budget leaves room for its one token only
    assert last > 14 and [r for r, m in modes.items() if m == "plain" and r <= 14] == [5, 6, 7, 11, 12, 13], modes
    assert modes[8] == modes[14] == "speculative"
    assert s.token_ids == plain.token_ids
    assert_consistent(engine)


def test_a_sampled_reply_with_plain_steps_is_the_same_however_slowly_it_is_read(engine, prompt, monkeypatch):
    """The plain steps' rounds do not depend on when the reader gets to them: the same seed gives the same reply
    read at once or with a pause after every round (as step-through reads it)."""
    monkeypatch.setattr(engine, "eos_ids", set())
    sampling = SamplingParams(temperature=0.9, seed=5, max_new_tokens=30)
    replies = []
    for pause in (0.0, 0.02):
        engine.reset()
        controls = Controls(sampling, SPEC)
        controls.plain_every = 4
        events, s = drive(engine, prompt, sampling, SPEC, controls, lambda ev, p=pause: time.sleep(p))
        assert "plain" in [ev.mode for ev in events[:-1]]
        replies.append(s.token_ids)
    assert replies[0] == replies[1]
