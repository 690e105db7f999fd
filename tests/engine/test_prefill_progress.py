"""A long prompt's reading, told after every chunk (the target's prefill, then the draft model's catch-up), and a
cancel that stops it within one chunk; the engine process's sending of that news, and its check on arrival."""
from __future__ import annotations

import time

import pytest

from engine.api.config import SamplingParams, SpecParams
from engine.api.events import PrefillProgress, Summary
from engine.api.live import Controls
from engine.api.protocol import EVENTS, Prefilling, problem
from engine.runtime.engine import Engine
from engine.service.streaming import PREFILL_S, PrefillNews
from tests.tiny import tiny_engine

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=12)
SPEC = SpecParams(k=3, drafter="model")
CHUNK = 8
TEXT = "def add(a, b):\n    return a + b\n# and a line or two more, so the prompt spans many chunks\n"


@pytest.fixture(scope="module")
def engine() -> Engine:
    return tiny_engine()


@pytest.fixture
def chunked(monkeypatch):
    import engine.model.forward as fwd

    monkeypatch.setattr(fwd, "PREFILL_CHUNK", CHUNK)


def run(engine: Engine, prompt: list[int], spec: SpecParams, controls: Controls) -> tuple[list, Summary]:
    items = list(engine.generate(prompt, GREEDY, spec, controls))
    assert isinstance(items[-1], Summary)
    return items[:-1], items[-1]


def listening(spec: SpecParams = SPEC) -> tuple[Controls, list[PrefillProgress]]:
    controls = Controls(GREEDY, spec)
    heard: list[PrefillProgress] = []
    controls.on_prefill = heard.append
    return controls, heard


def test_the_target_and_the_draft_report_their_reading_after_every_chunk(engine, chunked):
    prompt = engine.encode_chat([{"role": "user", "content": TEXT}])
    engine.reset()
    _, quiet = run(engine, prompt, SPEC, Controls(GREEDY, SPEC))  # nobody listening: the reference
    engine.reset()
    controls, heard = listening()
    _, s = run(engine, prompt, SPEC, controls)
    feed = len(prompt) - 1  # the last prompt token goes in with the first round's verify pass
    steps = [*range(0, feed, CHUNK), feed]
    target = [p for p in heard if p.model == "target"]
    draft = [p for p in heard if p.model == "draft"]
    assert [p.done for p in target] == steps and {(p.total, p.reused) for p in target} == {(feed, 0)}
    assert [p.done for p in draft] == steps and {(p.total, p.reused) for p in draft} == {(feed, 0)}
    assert heard.index(draft[0]) > heard.index(target[-1])  # the draft catches up in the first round
    assert s.token_ids == quiet.token_ids  # listening changes nothing


def test_a_follow_up_turn_reports_only_what_it_reads_past_the_reused_prefix(engine, chunked):
    first = engine.encode_chat([{"role": "user", "content": TEXT}])
    engine.reset()
    _, s = run(engine, first, SPEC, Controls(GREEDY, SPEC))
    second = engine.encode_chat([{"role": "user", "content": TEXT}, {"role": "assistant", "content": s.text},
                                 {"role": "user", "content": TEXT}])
    controls, heard = listening(SpecParams(enabled=False))
    _, s2 = run(engine, second, SpecParams(enabled=False), controls)
    assert heard and {p.model for p in heard} == {"target"}
    assert heard[-1].reused == s2.reused_prefix_tokens > 0
    assert heard[-1].done == heard[-1].total == len(second) - 1 - s2.reused_prefix_tokens


def test_a_prompt_of_one_chunk_says_nothing(engine, chunked):
    prompt = engine.encode_chat([{"role": "user", "content": TEXT}])[: CHUNK + 1]  # feeds exactly one chunk
    engine.reset()
    controls, heard = listening()
    run(engine, prompt, SPEC, controls)
    assert heard == []


@pytest.mark.parametrize("model", ["target", "draft"])
def test_a_cancel_after_the_first_chunk_stops_before_the_next(engine, chunked, model):
    prompt = engine.encode_chat([{"role": "user", "content": TEXT}])
    engine.reset()
    controls, heard = listening()
    controls.on_prefill = lambda p: (heard.append(p), p.model == model and p.done > 0 and controls.cancel())
    events, s = run(engine, prompt, SPEC, controls)
    mine = [p for p in heard if p.model == model]
    assert [p.done for p in mine] == [0, CHUNK]  # stopped within one chunk of the cancel
    assert mine[-1].done < mine[-1].total  # long before the prompt was read
    assert events == [] and (s.stop_reason, s.new_tokens) == ("cancelled", 0)
    if model == "target":
        assert engine.target_pool.manager.length(0) == CHUNK and engine.ids == prompt[: CHUNK + 1]
    else:
        assert engine.model_drafter.cached == prompt[:CHUNK]
    run(engine, prompt, SPEC, Controls(GREEDY, SPEC))  # the chunks done are reused; the engine serves on


def test_the_news_is_thinned_but_its_start_its_end_and_each_model_always_go(monkeypatch):
    sent: list[object] = []
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    news = PrefillNews(7, sent.append)
    for done in range(0, 1001, 10):  # a small model's chunks, all within one instant
        news(PrefillProgress("target", done, 1000))
    clock[0] += 1.5 * PREFILL_S
    news(PrefillProgress("draft", 0, 1000))
    news(PrefillProgress("draft", 500, 1000))  # same instant: thinned
    clock[0] += 1.5 * PREFILL_S
    news(PrefillProgress("draft", 600, 1000))
    assert all(isinstance(m, Prefilling) and m.rid == 7 for m in sent)
    assert [(m.progress.model, m.progress.done) for m in sent] == [
        ("target", 0), ("target", 1000), ("draft", 0), ("draft", 600)]


def test_progress_past_its_total_is_refused_on_arrival():
    with pytest.raises(ValueError, match="done <= total"):
        PrefillProgress("target", 5, 4)
    forged = object.__new__(PrefillProgress)  # as unpickling makes one: no __init__, so no check
    for name, value in {"model": "target", "done": 9, "total": 4, "reused": 0}.items():
        object.__setattr__(forged, name, value)
    msg = object.__new__(Prefilling)
    object.__setattr__(msg, "rid", 1)
    object.__setattr__(msg, "progress", forged)
    assert problem(msg, EVENTS).startswith("Prefilling.progress: ")
    assert problem(Prefilling(1, PrefillProgress("target", 4, 4)), EVENTS) is None
