"""Step-through in the engine: phase events, the pause gate, and the promise that stepping changes no token."""
import threading
import time

import pytest

from engine.api.config import SamplingParams, SpecParams
from engine.api.events import CacheRollback, Phase, PhaseEvent, RoundEvent, Summary
from engine.api.live import Controls, StepGate
from tests.tiny import tiny_engine

SAMPLED = SamplingParams(temperature=0.9, top_p=0.95, seed=11, max_new_tokens=40)
GREEDY = SamplingParams(temperature=0.0, seed=0, max_new_tokens=40)


@pytest.fixture(scope="module")
def engine():
    e = tiny_engine()
    e.eos_ids = set()  # a random model says EOS early: run to the token limit
    return e


def run(engine, sampling, spec, controls=None):
    engine.reset()
    ids = engine.encode_chat([{"role": "user", "content": "Tell me about the sea."}])
    events = list(engine.generate(ids, sampling, spec, controls))
    return [e for e in events if isinstance(e, RoundEvent)], events[-1]


def stepping_controls(sampling, spec):
    """Controls that step through every phase at once, recording each PhaseEvent."""
    c = Controls(sampling, spec)
    c.gate.set_stepping(True)
    seen: list[PhaseEvent] = []

    def on_phase(ev):
        seen.append(ev)
        c.gate.step()

    c.on_phase = on_phase
    return c, seen


@pytest.mark.parametrize("sampling", [SAMPLED, GREEDY], ids=["sampled", "greedy"])
@pytest.mark.parametrize("spec", [SpecParams(k=3), SpecParams(k=5, drafter="ngram"), SpecParams(enabled=False)],
                         ids=["model", "ngram", "plain"])
def test_stepping_never_changes_the_output(engine, sampling, spec):
    rounds, plain = run(engine, sampling, spec)
    controls, seen = stepping_controls(sampling, spec)
    stepped_rounds, stepped = run(engine, sampling, spec, controls)
    assert stepped.token_ids == plain.token_ids and stepped.text == plain.text
    assert [(r.accepted, len(r.drafted)) for r in stepped_rounds] == [(r.accepted, len(r.drafted)) for r in rounds]
    assert seen, "stepping produced no phase"


def test_phases_match_the_rounds(engine):
    spec = SpecParams(k=4)
    controls, seen = stepping_controls(SAMPLED, spec)
    rounds, summary = run(engine, SAMPLED, spec, controls)
    by_round: dict[int, list[PhaseEvent]] = {}
    for ev in seen:
        by_round.setdefault(ev.round, []).append(ev)
    assert sorted(by_round) == [r.round for r in rounds]
    for r in rounds:
        phases = by_round[r.round]
        if r.drafted:
            assert [p.phase for p in phases] == [Phase.DRAFTED, Phase.VERIFIED, Phase.DECIDED]
        else:
            assert [p.phase for p in phases] == [Phase.DECIDED]
        drafted, verified, decided = (phases if r.drafted else (None, None, phases[0]))
        assert decided.tokens == tuple(d.token_id for d in r.drafted)
        assert decided.accepted == r.accepted and decided.committed == r.committed
        assert decided.q == pytest.approx(tuple(d.q for d in r.drafted), rel=1e-5)
        assert decided.p == pytest.approx(tuple(d.p for d in r.drafted), rel=1e-5)
        if r.drafted:
            assert drafted.p == () and drafted.accepted is None and drafted.q == decided.q
            assert verified.p == pytest.approx(decided.p, rel=1e-5) and verified.accepted is None
        target, draft = decided.rollback  # the draft model's cache rolls back too
        assert (target.cache, draft.cache) == ("target", "draft")
        # Verify wrote K+1 positions after the committed text; rollback keeps the committed ones only.
        assert target.positions_freed == len(r.drafted) + 1 - len(r.committed)
        # The draft's cache keeps the committed text too, less the last drafted token after a bonus round.
        assert target.positions_after - draft.positions_after in (0, 1)


def test_ngram_rounds_roll_back_the_target_only(engine):
    spec = SpecParams(k=4, drafter="ngram")
    controls, seen = stepping_controls(GREEDY, spec)
    run(engine, GREEDY, spec, controls)
    decided = [ev for ev in seen if ev.phase == Phase.DECIDED]
    assert decided and all([r.cache for r in ev.rollback] == ["target"] for ev in decided)


def test_the_gate_holds_the_engine_until_a_step(engine):
    spec = SpecParams(k=3)
    sampling = SAMPLED.with_(max_new_tokens=12)
    controls = Controls(sampling, spec)
    controls.gate.set_stepping(True)
    seen: list[PhaseEvent] = []
    controls.on_phase = seen.append
    out: list = []
    engine.reset()
    ids = engine.encode_chat([{"role": "user", "content": "Hi"}])
    worker = threading.Thread(target=lambda: out.extend(engine.generate(ids, sampling, spec, controls)))
    worker.start()
    try:
        deadline = time.monotonic() + 10
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [e.phase for e in seen] == [Phase.DRAFTED]
        time.sleep(0.3)  # nothing moves while paused
        assert len(seen) == 1 and not out
        controls.gate.step()
        while len(seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert [e.phase for e in seen] == [Phase.DRAFTED, Phase.VERIFIED]
        time.sleep(0.3)
        controls.gate.step()
        while len(seen) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        assert seen[-1].phase == Phase.DECIDED and not out  # its RoundEvent waits for the next step
        controls.gate.set_stepping(False)  # continue: the rest runs without pausing
        worker.join(10)
        assert not worker.is_alive()
    finally:
        controls.cancel()
        worker.join(10)
    rounds = [e for e in out if isinstance(e, RoundEvent)]
    assert isinstance(out[-1], Summary) and out[-1].stop_reason == "length"
    # The 0.6 s held at the gate is no part of any timing.
    assert rounds[0].draft_ms + rounds[0].verify_ms < 300
    assert out[-1].total_s < 0.5 + sum(r.draft_ms + r.verify_ms for r in rounds) / 1e3


def test_cancel_while_paused_stops_after_the_round(engine):
    spec = SpecParams(k=3)
    controls = Controls(SAMPLED, spec)
    controls.gate.set_stepping(True)
    seen: list[PhaseEvent] = []
    controls.on_phase = seen.append
    out: list = []
    engine.reset()
    ids = engine.encode_chat([{"role": "user", "content": "Hi"}])
    worker = threading.Thread(target=lambda: out.extend(engine.generate(ids, SAMPLED, spec, controls)))
    worker.start()
    deadline = time.monotonic() + 10
    while not seen and time.monotonic() < deadline:
        time.sleep(0.01)
    controls.cancel()
    worker.join(10)
    assert not worker.is_alive()
    assert len(seen) == 1  # no phase after the cancel
    rounds = [e for e in out if isinstance(e, RoundEvent)]
    assert len(rounds) == 1 and out[-1].stop_reason == "cancelled"


def test_step_gate():
    gate = StepGate()
    assert not gate.stepping and gate.wait(0.01)  # not stepping: never waits
    gate.set_stepping(True)
    assert not gate.wait(0.01)  # stepping, no step yet
    gate.step()
    gate.step()
    assert gate.wait(0.01) and gate.wait(0.01) and not gate.wait(0.01)  # steps pressed early are kept
    gate.step()
    gate.set_stepping(True)  # switching it (back) on forgets them
    assert not gate.wait(0.01)
    gate.release()
    assert not gate.stepping and gate.wait(0.01)
    gate.set_stepping(True)
    assert not gate.stepping  # released for good


def test_phase_event_checks_its_fields():
    with pytest.raises(ValueError, match="one text, one q"):
        PhaseEvent(1, Phase.DRAFTED, "model", 2, (5, 6), ("a",), (0.5, 0.5))
    with pytest.raises(ValueError, match="needs p"):
        PhaseEvent(1, Phase.VERIFIED, "model", 2, (5,), ("a",), (0.5,))
    with pytest.raises(ValueError, match="accepted"):
        PhaseEvent(1, Phase.DECIDED, "model", 2, (5,), ("a",), (0.5,), (0.4,), accepted=2)
    with pytest.raises(ValueError, match="cache"):
        CacheRollback("both", 3, 1, 1, 1)
    r = CacheRollback("target", 12, 9, 2, 1)
    assert (r.positions_freed, r.blocks_freed) == (3, 1)
