"""Engine reliability: failures, cancels, bad values and misuse leave the engine exact and usable."""
from __future__ import annotations

import json
import logging
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import engine.model.forward as forward_mod
import engine.runtime.clock as clock_mod
import engine.spec.drafters.base as drafter_base
import engine.spec.drafters.model as model_drafter_mod
from engine.analysis.stats import ROUND_COLUMNS, SUMMARY_COLUMNS, SessionStats
from engine.api.config import CacheConfig, SamplingParams, SpecParams
from engine.api.events import RoundEvent, Summary
from engine.model.transformer import Transformer
from engine.runtime.engine import Controls, Engine
from engine.spec.adaptive import AdaptiveK
from engine.spec.sampling import probs_from_logits, tempered_softmax
from tests.tiny import (
    ENGINE_CFG,
    hf_model,
    model_config,
    state_dict,
    tiny_engine,
    tiny_tokenizer,
)

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=24)
SPEC = SpecParams(k=4)
HELLO = [{"role": "user", "content": "hello there"}]


def run(engine: Engine, prompt: list[int], sampling=GREEDY, spec=SPEC) -> tuple[list[RoundEvent], Summary]:
    *events, summary = engine.generate(prompt, sampling, spec)
    assert isinstance(summary, Summary)
    return events, summary


def assert_consistent(engine: Engine) -> None:
    """The target cache holds ids[:-1]; the draft cache holds a prefix of the committed ids."""
    assert engine.target_pool.manager.length(0) == len(engine.ids) - 1
    d = engine.model_drafter
    assert engine.ids[: len(d.cached)] == d.cached and d.pool.manager.length(0) == len(d.cached)


@pytest.fixture(scope="module")
def engine() -> Engine:
    return tiny_engine()


@pytest.fixture(scope="module")
def fresh_plain():
    """Greedy tokens of a never-used engine, by prompt: what any correct engine state must reproduce."""
    memo: dict[tuple[int, ...], tuple[int, ...]] = {}

    def get(prompt: list[int]) -> tuple[int, ...]:
        if tuple(prompt) not in memo:
            memo[tuple(prompt)] = run(tiny_engine(), prompt, spec=SpecParams(enabled=False))[1].token_ids
        return memo[tuple(prompt)]

    return get


def fail_call(model: torch.nn.Module, monkeypatch, when) -> list[int]:
    """Make model's forward raise (a stand-in for CUDA OOM) on the calls for which when(n, ids) holds."""
    real = model.forward
    calls: list[int] = []

    def flaky(ids, *args, **kw):
        calls.append(len(ids))
        if when(len(calls), ids):
            raise RuntimeError("out of memory (simulated)")
        return real(ids, *args, **kw)

    monkeypatch.setattr(model, "forward", flaky)
    return calls


# --- 1. a failed prefill must not poison prefix reuse -------------------------------------------------------


def follow_up(engine: Engine, reply: str) -> list[int]:
    return engine.encode_chat(HELLO + [{"role": "assistant", "content": reply},
                                       {"role": "user", "content": "and now something longer, please: " * 2}])


def test_retry_after_a_failed_prefill_equals_a_fresh_engine(monkeypatch, fresh_plain):
    eng = tiny_engine()
    _, first = run(eng, eng.encode_chat(HELLO))  # cached state a retry could wrongly reuse
    prompt = follow_up(eng, first.text)
    fail_call(eng.target, monkeypatch, lambda n, ids: n == 1)  # the follow-up's prefill pass
    with pytest.raises(RuntimeError, match="simulated"):
        next(eng.generate(prompt, GREEDY, SPEC))
    m = eng.target_pool.manager
    assert eng.ids == prompt[: m.length(0)]  # no claim on positions that were never written
    _, retry = run(eng, prompt)
    assert retry.token_ids == fresh_plain(prompt)
    assert_consistent(eng)


def test_failed_chunk_of_a_long_prefill_keeps_the_chunks_before_it(monkeypatch, fresh_plain):
    monkeypatch.setattr(forward_mod, "PREFILL_CHUNK", 8)
    eng = tiny_engine()
    prompt = follow_up(eng, "a reply")
    assert len(prompt) > 3 * 8
    fail_call(eng.target, monkeypatch, lambda n, ids: n == 3)  # the third 8-token chunk
    with pytest.raises(RuntimeError, match="simulated"):
        next(eng.generate(prompt, GREEDY, SPEC))
    assert eng.target_pool.manager.length(0) == 16 and eng.ids == prompt[:16]
    _, retry = run(eng, prompt)
    assert retry.reused_prefix_tokens == 16  # the two chunks that were written are reused
    assert retry.token_ids == fresh_plain(prompt)


def test_failed_draft_prefill_is_rolled_back(monkeypatch, fresh_plain):
    eng = tiny_engine()
    prompt = eng.encode_chat(HELLO)
    fail_call(eng.draft, monkeypatch, lambda n, ids: n == 1)
    with pytest.raises(RuntimeError, match="simulated"):
        run(eng, prompt)
    assert_consistent(eng)
    _, retry = run(eng, prompt)
    assert retry.token_ids == fresh_plain(prompt)


# --- 2. a cancel keeps the text held back for a possible stop string ----------------------------------------


def test_cancel_with_a_partly_matched_stop_string_keeps_the_text(engine):
    prompt = engine.encode_chat(HELLO)
    engine.reset()
    events, base = run(engine, prompt, spec=SpecParams(k=4))
    shown = events[0].text_delta
    assert shown
    sampling = GREEDY.with_(stop=(shown[-1] + "\n\n",))  # its first character is held back after round 1
    controls = Controls(sampling, SPEC)
    engine.reset()
    deltas, summary = [], None
    for item in engine.generate(prompt, sampling, SPEC, controls):
        if isinstance(item, Summary):
            summary = item
            break
        deltas.append(item.text_delta)
        controls.cancel()
    assert summary is not None and summary.stop_reason == "cancelled" and summary.rounds == 1
    assert "".join(deltas) == shown[:-1]  # held back while the request ran...
    decoded = engine.tokenizer.decode(list(summary.token_ids), skip_special_tokens=True)
    assert summary.text == decoded == shown  # ...and part of the reply once it was cancelled
    assert summary.text_tail == shown[-1]
    assert "".join(deltas) + summary.text_tail == summary.text
    assert_consistent(engine)


@pytest.mark.parametrize("stop_reason", ["length", "eos"])
def test_other_non_stop_endings_release_held_back_text(stop_reason):
    eng = tiny_engine()
    prompt = eng.encode_chat(HELLO)
    _, base = run(eng, prompt, GREEDY.with_(max_new_tokens=12), SPEC)
    last = base.token_ids[-1]
    eng = tiny_engine(eos_ids={last}) if stop_reason == "eos" else eng
    eng.reset()
    tail = eng.tokenizer.decode([last])
    events, s = run(eng, prompt, GREEDY.with_(max_new_tokens=12, stop=(tail + "\n\n",)), SPEC)
    assert s.stop_reason == stop_reason
    assert s.text == "".join(e.text_delta for e in events) == eng.tokenizer.decode(list(s.token_ids),
                                                                                    skip_special_tokens=True)
    assert s.text_tail == ""


# --- 3. one bad entry in the HF cache must not empty the model list -----------------------------------------


def nested_array_gguf(path) -> None:
    """A GGUF whose embedding_length is an array of arrays where a number belongs."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(2)
    w.add_head_count(4)
    w.add_feed_forward_length(16)
    w.add_array("llama.embedding_length", [[64]])
    w.add_tensor("token_embd.weight", np.zeros((8, 64), np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def test_bad_cache_entries_are_skipped_with_a_warning(tmp_path, monkeypatch, caplog):
    from engine.io import hub, provision
    from tests.engine.test_hub import cache_repo
    from tests.engine.test_weights import (
        make_hf_model,
        make_tokenizer,
        save_hf_folder,
        write_gguf,
    )

    cache = tmp_path / "hf" / "hub"
    cache.mkdir(parents=True)
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("SPECLENS_CACHE", str(tmp_path / "speclens"))
    tok = make_tokenizer()
    emb = write_gguf(tmp_path / "embedded.gguf", make_hf_model("qwen2", len(tok)), tok, "F32")
    monkeypatch.setattr(provision, "locate_part", lambda pkg: emb)  # the embedded pair, not yet converted

    save_hf_folder(cache_repo(cache, "good/llama"))
    (cache_repo(cache, "bad/list-config") / "config.json").write_text(json.dumps([{"model_type": "llama"}]))
    nested_array_gguf(cache_repo(cache, "bad/nested-gguf") / "model.gguf")

    with caplog.at_level(logging.WARNING, logger="engine.io.hub"):
        models = hub.list_local_models()
    names = [m.name for m in models]
    assert names == [provision.TARGET.name, provision.DRAFT.name, "good/llama"]
    warned = " ".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert "list-config" in warned and "nested-gguf" in warned


# --- 4. sampling values ------------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["temperature", "top_p", "repetition_penalty"])
@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_sampling_values_are_refused(field, value):
    with pytest.raises(ValueError, match=rf"{field} must be a finite number, got {value!r}"):
        SamplingParams(**{field: value})


@pytest.mark.parametrize("kw,msg", [
    (dict(top_k=2.5), "top_k must be an integer"),
    (dict(max_new_tokens=8.0), "max_new_tokens must be an integer"),
    (dict(seed=-1), r"seed must be in \[0, 2\*\*64\)"),
    (dict(seed=2**64), r"seed must be in \[0, 2\*\*64\)"),
    (dict(seed=1.5), "seed must be an integer"),
    (dict(temperature="0.7"), "temperature must be a number"),
    (dict(stop=("ok", 3)), "stop strings must be str"),
    (dict(stop=7), "stop must be a string or a sequence of strings"),
])
def test_other_bad_sampling_values_are_refused(kw, msg):
    with pytest.raises(ValueError, match=msg):
        SamplingParams(**kw)


@pytest.mark.parametrize("cls,kw,msg", [
    (SpecParams, dict(k=2.0), "k must be an integer"),
    (SpecParams, dict(ngram_max=True), "ngram_max must be an integer"),
    (SpecParams, dict(stop_below=1.0), r"stop_below must be in \[0, 1\), got 1.0"),
    (SpecParams, dict(stop_below=-0.1), r"stop_below must be in \[0, 1\), got -0.1"),
    (SpecParams, dict(stop_below=math.nan), "stop_below must be a finite number"),
    (SpecParams, dict(stop_below="0.7"), "stop_below must be a number"),
    (CacheConfig, dict(block_size=8.0), "block_size must be an integer"),
    (CacheConfig, dict(max_seq_len=None), "max_seq_len must be an integer"),
])
def test_bad_spec_and_cache_values_are_refused(cls, kw, msg):
    with pytest.raises(ValueError, match=msg):
        cls(**kw)


def test_a_single_stop_string_is_one_stop_string(engine):
    assert SamplingParams(stop="\n\n").stop == ("\n\n",)
    assert SamplingParams(stop=["a", "", "bc"]).stop == ("a", "bc")
    prompt = engine.encode_chat(HELLO)
    engine.reset()
    _, base = run(engine, prompt)
    text = base.text
    # A two-character stop first occurring at i whose second character occurs before i: split into
    # characters, it would stop earlier.
    i = next(i for i in range(1, len(text) - 1) if text.find(text[i : i + 2]) == i and text[i + 1] in text[:i])
    engine.reset()
    _, s = run(engine, prompt, GREEDY.with_(stop=text[i : i + 2]))
    assert s.stop_reason == "stop" and s.text == text[:i]


@pytest.mark.parametrize("temperature", [1e-40, 1e-300, 5e-324])
def test_tiny_temperature_samples_the_argmax(engine, temperature):
    prompt = engine.encode_chat(HELLO)
    engine.reset()
    _, greedy = run(engine, prompt)
    for drafter in ("model", "ngram"):
        engine.reset()
        _, s = run(engine, prompt, GREEDY.with_(temperature=temperature, seed=3), SpecParams(k=4, drafter=drafter))
        assert s.token_ids == greedy.token_ids  # random logits have no exact ties: the limit is the argmax


def test_tiny_temperature_splits_exact_ties_evenly():
    """T -> 0 tends to the uniform distribution over the tied maxima; no cut-off to greedy is taken."""
    logits = torch.tensor([1.0, 3.0, 3.0, 0.0, 3.0 - 1e-6])
    for t in (1e-3, 1e-40, 5e-324):
        p = probs_from_logits(logits, SamplingParams(temperature=t), torch.empty(0, dtype=torch.long))
        assert torch.isfinite(p).all()
        if t < 1e-30:
            assert p.tolist() == [0.0, 0.5, 0.5, 0.0, 0.0]
    x = torch.randn(3, 50) * 4
    for t in (0.3, 1.0, 2.5):  # ordinary temperatures: the plain softmax, up to rounding
        torch.testing.assert_close(tempered_softmax(x, t), torch.softmax(x / t, -1))


def test_repetition_penalty_nan_never_reaches_generation(engine):
    with pytest.raises(ValueError, match="repetition_penalty"):
        GREEDY.with_(repetition_penalty=float("nan"))


# --- 6. one generate() at a time per engine ----------------------------------------------------------------


def test_second_generator_is_refused_while_the_first_runs(engine, fresh_plain):
    prompt = engine.encode_chat(HELLO)
    other = engine.encode_chat([{"role": "user", "content": "something else entirely"}])
    engine.reset()
    first = engine.generate(prompt, GREEDY, SPEC)
    events = [next(first)]
    second = engine.generate(other, GREEDY, SPEC)
    with pytest.raises(RuntimeError, match="already running a generate"):
        next(second)
    *rest, summary = first  # the first one is unaffected
    assert summary.token_ids == fresh_plain(prompt)
    # Finished: a new request may start.
    engine.reset()
    assert run(engine, other)[1].token_ids == fresh_plain(other)


def test_closing_or_failing_releases_the_engine(engine, monkeypatch, fresh_plain):
    prompt = engine.encode_chat(HELLO)
    engine.reset()
    g = engine.generate(prompt, GREEDY, SPEC)
    next(g)
    g.close()
    assert run(engine, prompt)[1].token_ids == fresh_plain(prompt)

    with pytest.raises(ValueError, match="empty"):  # an input error at the first next()
        next(engine.generate([], GREEDY, SPEC))
    g = engine.generate(prompt, GREEDY, SPEC)  # an error part-way through
    next(g)
    fail_call(engine.target, monkeypatch, lambda n, ids: True)
    with pytest.raises(RuntimeError, match="simulated"):
        next(g)
    monkeypatch.undo()
    engine.reset()
    assert run(engine, prompt)[1].token_ids == fresh_plain(prompt)


# --- 7. the context length must fit both models ------------------------------------------------------------


def tiny_model(max_position_embeddings: int, rope_len: int, seed: int = 0) -> Transformer:
    cfg_dict = dict(ENGINE_CFG, max_position_embeddings=max_position_embeddings)
    sd = state_dict(hf_model(ENGINE_CFG, seed))
    # The RoPE table is built at the cache length, as loading does: only the config knows the real limit.
    return Transformer.from_state_dict(model_config(cfg_dict), sd, torch.float32, "cpu", rope_len)


def test_cache_longer_than_the_targets_context_is_refused():
    target = tiny_model(512, 700)
    with pytest.raises(ValueError) as err:
        Engine(target, tiny_tokenizer(), cache=CacheConfig(block_size=8, max_seq_len=700))
    msg = str(err.value)
    assert "700" in msg and "512" in msg and "target" in msg and "max_position_embeddings" in msg


def test_draft_with_a_shorter_context_than_the_cache_is_refused():
    target, draft = tiny_model(512, 256), tiny_model(128, 256, seed=1)
    with pytest.raises(ValueError) as err:
        Engine(target, tiny_tokenizer(), draft, cache=CacheConfig(block_size=8, max_seq_len=256))
    msg = str(err.value)
    assert "256" in msg and "128" in msg and "draft" in msg and "max_position_embeddings" in msg
    eng = Engine(target, tiny_tokenizer(), draft)  # the default cache fits the shorter of the two
    assert eng.max_seq_len == 128


# --- 8. the draft's prompt prefill is timed apart; adaptive K stays under the K set ----------------------------


class FakeClock:
    """perf_counter for the engine and drafters: advances only when a model runs, by a known amount."""

    def __init__(self) -> None:
        self.now = 0.0

    def perf_counter(self) -> float:
        return self.now


def timed(model: torch.nn.Module, monkeypatch, clock: FakeClock, per_call: float, per_token: float) -> None:
    real = model.forward

    def forward(ids, *args, **kw):
        clock.now += per_call + per_token * len(ids)
        return real(ids, *args, **kw)

    monkeypatch.setattr(model, "forward", forward)


def test_draft_prefill_is_reported_apart_from_drafting(monkeypatch):
    eng = tiny_engine()
    clock = FakeClock()
    fake_time = SimpleNamespace(perf_counter=clock.perf_counter)
    monkeypatch.setattr(clock_mod, "time", fake_time)
    monkeypatch.setattr(model_drafter_mod, "time", fake_time)
    timed(eng.draft, monkeypatch, clock, per_call=1.0, per_token=10.0)
    timed(eng.target, monkeypatch, clock, per_call=100.0, per_token=0.0)
    seen: list[tuple[int, int, float, float]] = []
    monkeypatch.setattr(AdaptiveK, "observe", lambda self, *a: seen.append(a))
    prompt = eng.encode_chat(HELLO)
    k = 3
    events, s = run(eng, prompt, GREEDY.with_(max_new_tokens=12), SpecParams(k=k, adaptive=True))
    first = events[0]
    # Round 1: the draft catches up with prompt[:-1] in one pass, then drafts K tokens one at a time.
    assert first.draft_prefill_ms == pytest.approx((1.0 + 10.0 * (len(prompt) - 1)) * 1e3)
    assert first.draft_ms == pytest.approx(len(first.drafted) * 11.0 * 1e3)
    assert all(e.draft_prefill_ms == 0.0 for e in events[1:])
    assert s.draft_prefill_ms == first.draft_prefill_ms
    assert s.draft_ms == pytest.approx(sum(e.draft_ms for e in events))
    assert seen[0][2] == pytest.approx(11.0)  # adaptive K's cost estimate never sees the prefill


def test_draft_prefill_column_in_the_csv(tmp_path, engine):
    import csv

    prompt = engine.encode_chat(HELLO)
    engine.reset()
    events, s = run(engine, prompt)
    stats = SessionStats()
    rec = stats.begin("hello there")
    rec.rounds.extend(events)
    rec.summary = s
    main, side = stats.write_csv(tmp_path / "s.csv")
    assert "draft_prefill_ms" in ROUND_COLUMNS and "draft_prefill_ms" in SUMMARY_COLUMNS
    rows = list(csv.DictReader(main.open()))
    assert [float(r["draft_prefill_ms"]) for r in rows] == [round(e.draft_prefill_ms, 3) for e in events]
    assert float(rows[0]["draft_prefill_ms"]) > 0
    (row,) = csv.DictReader(side.open())
    assert float(row["draft_prefill_ms"]) == round(s.draft_prefill_ms, 3)


def test_old_round_event_constructors_still_work():
    ev = RoundEvent(1, "plain", None, 0, 0.0, (), (), "", 0.0, 1.0, 0.0, 1)
    assert ev.draft_prefill_ms == 0.0


def test_adaptive_k_never_exceeds_the_k_set(engine, monkeypatch, fresh_plain):
    class Eager(AdaptiveK):
        """Believes every draft is accepted and drafting is free: it would pick the largest K allowed."""

        alpha = 0.999

        def __init__(self) -> None:
            super().__init__(c=1e-6)

        def observe(self, *a) -> None:
            pass

    monkeypatch.setattr(drafter_base, "AdaptiveK", Eager)
    assert Eager().choose(SpecParams(k=3, k_max=16)) == 3
    prompt = engine.encode_chat(HELLO)
    engine.reset()
    events, s = run(engine, prompt, spec=SpecParams(k=3, k_max=16, adaptive=True))
    assert {e.k for e in events if e.mode == "speculative"} <= {1, 2, 3}
    assert max(e.k for e in events) == 3
    assert s.token_ids == fresh_plain(prompt)
