"""Bad inputs fail early with a message that says what is wrong."""
from __future__ import annotations

import pytest
import torch

from engine.api.config import CacheConfig, SamplingParams, SpecParams
from engine.model.transformer import Transformer
from engine.runtime.engine import Controls, Engine
from tests.tiny import (
    ENGINE_CFG,
    hf_model,
    model_config,
    state_dict,
    tiny_engine,
    tiny_tokenizer,
)

GREEDY = SamplingParams(max_new_tokens=4)
VOCAB = ENGINE_CFG["vocab_size"]


@pytest.fixture(scope="module")
def engine() -> Engine:
    return tiny_engine(max_seq_len=64)


def start(engine: Engine, prompt, sampling=GREEDY, spec=SpecParams()):
    """generate() is lazy: input errors surface on the first next()."""
    return next(engine.generate(prompt, sampling, spec))


def assert_untouched(engine: Engine, ids_before: list[int]) -> None:
    assert engine.ids == ids_before
    assert engine.target_pool.manager.length(0) == max(0, len(ids_before) - 1)


@pytest.mark.parametrize("k", [0, -1])
def test_k_below_one(k):
    with pytest.raises(ValueError, match="K must be >= 1"):
        SpecParams(k=k)


def test_k_above_k_max():
    with pytest.raises(ValueError, match="K must be <= 16"):
        SpecParams(k=17)
    assert SpecParams(k=17, k_max=32).k == 17


def test_bad_drafter_name():
    with pytest.raises(ValueError, match="drafter"):
        SpecParams(drafter="medusa")  # type: ignore[arg-type]


@pytest.mark.parametrize("kw,field", [
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature=11.0), "temperature"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(top_p=-0.2), "top_p"),
    (dict(top_k=-1), "top_k"),
    (dict(repetition_penalty=0.0), "repetition_penalty"),
    (dict(max_new_tokens=0), "max_new_tokens"),
])
def test_bad_sampling_values(kw, field):
    with pytest.raises(ValueError, match=field) as err:
        SamplingParams(**kw)
    assert repr(next(iter(kw.values()))) in str(err.value) or str(next(iter(kw.values()))) in str(err.value)


def test_edge_sampling_values_are_fine():
    SamplingParams(temperature=0.0, top_p=1.0, top_k=0)
    SamplingParams(temperature=10.0, top_p=1e-6)


def test_bad_cache_config():
    with pytest.raises(ValueError, match="block_size"):
        CacheConfig(block_size=0)
    with pytest.raises(ValueError, match="max_seq_len"):
        CacheConfig(max_seq_len=1)


def test_over_long_prompt(engine):
    engine.reset()
    prompt = [5] * 70
    with pytest.raises(ValueError) as err:
        start(engine, prompt)
    msg = str(err.value)
    assert "70" in msg and "64" in msg and "token" in msg
    assert_untouched(engine, [])
    with pytest.raises(ValueError, match="64"):
        start(engine, [5] * 64)  # no room left for even one new token


def test_prompt_just_under_the_context_still_generates(engine):
    engine.reset()
    *events, summary = engine.generate([5] * 63, SamplingParams(max_new_tokens=10), SpecParams(k=8))
    assert summary.stop_reason == "length"
    assert 1 <= summary.new_tokens and len(engine.ids) <= 64
    assert engine.target_pool.manager.length(0) == len(engine.ids) - 1


def test_empty_prompt(engine):
    engine.reset()
    with pytest.raises(ValueError, match="empty"):
        start(engine, [])
    assert_untouched(engine, [])


@pytest.mark.parametrize("bad", [VOCAB, 10_000, -1])
def test_out_of_vocab_token(engine, bad):
    prompt = engine.encode_chat([{"role": "user", "content": "hi"}])
    engine.reset()
    start(engine, prompt)  # a valid request first, so there is state to keep
    before = list(engine.ids)
    with pytest.raises(ValueError) as err:
        start(engine, prompt[:3] + [bad] + prompt[3:])
    msg = str(err.value)
    assert str(bad) in msg and "vocab" in msg and str(VOCAB - 1) in msg
    assert_untouched(engine, before)


def test_model_drafter_without_a_draft_model():
    eng = tiny_engine(draft=False)
    prompt = eng.encode_chat([{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match="draft model"):
        start(eng, prompt, spec=SpecParams(drafter="model"))
    assert eng.ids == []
    # The n-gram drafter and plain decoding work without one.
    *_, s = eng.generate(prompt, GREEDY, SpecParams(drafter="ngram"))
    assert s.new_tokens == 4
    *_, s = eng.generate(prompt, GREEDY, SpecParams(enabled=False, drafter="model"))
    assert s.new_tokens == 4


def test_switching_to_model_drafter_mid_request_without_a_draft_model():
    eng = tiny_engine(draft=False)
    prompt = eng.encode_chat([{"role": "user", "content": "hi"}])
    controls = Controls(GREEDY.with_(max_new_tokens=10), SpecParams(enabled=False))
    gen = eng.generate(prompt, controls.sampling, controls.spec, controls)
    next(gen)
    controls.spec = SpecParams(drafter="model")
    with pytest.raises(ValueError, match="draft model"):
        next(gen)
    assert eng.target_pool.manager.length(0) == len(eng.ids) - 1  # still consistent


def test_vocab_mismatch_between_draft_and_target():
    cfg_t = model_config(ENGINE_CFG)
    target = Transformer.from_state_dict(cfg_t, state_dict(hf_model(ENGINE_CFG, 0)), torch.float32, "cpu", 128)
    small = dict(ENGINE_CFG, vocab_size=ENGINE_CFG["vocab_size"] - 4)
    draft = Transformer.from_state_dict(model_config(small), state_dict(hf_model(small, 1)), torch.float32, "cpu", 128)
    with pytest.raises(ValueError) as err:
        Engine(target, tiny_tokenizer(), draft, cache=CacheConfig(block_size=8, max_seq_len=64))
    msg = str(err.value)
    assert "vocab" in msg and str(small["vocab_size"]) in msg and str(ENGINE_CFG["vocab_size"]) in msg


def test_one_token_prompt_works(engine):
    engine.reset()
    *_, s = engine.generate([5], GREEDY, SpecParams(k=3))
    assert s.new_tokens == 4 and s.prompt_tokens == 1
    assert engine.target_pool.manager.length(0) == len(engine.ids) - 1


def test_context_longer_than_the_model_supports_is_refused_clearly():
    """The tiny target has 512 positions (max_position_embeddings and its RoPE table). A cache configured
    for 700 must not let a 600-token prompt through to fail deep inside attention with a shape error."""
    try:
        eng = tiny_engine(max_seq_len=700)
    except ValueError as err:  # refusing the configuration up front is fine too
        assert "700" in str(err) and "512" in str(err)
        return
    with pytest.raises(ValueError) as err:
        start(eng, [5] * 600)
    msg = str(err.value)
    assert "600" in msg and "512" in msg


def test_kv_cache_exhausted_mid_request_is_clear_and_recoverable():
    from engine.model.kv_cache import CacheFullError
    from tests.tiny import draft_weights

    cfg = model_config(ENGINE_CFG)
    sd = state_dict(hf_model(ENGINE_CFG, 0))
    target = Transformer.from_state_dict(cfg, sd, torch.float32, "cpu", 256)
    draft = Transformer.from_state_dict(cfg, draft_weights(sd, 0.03, 1), torch.float32, "cpu", 256)
    # 8 blocks of 8 = 64 slots, although the context claims 256: the pool runs out first.
    eng = Engine(target, tiny_tokenizer(), draft, cache=CacheConfig(block_size=8, max_seq_len=256, num_blocks=8))
    prompt = eng.encode_chat([{"role": "user", "content": "hello there"}])  # its greedy reply has no EOS
    events = []
    with pytest.raises(CacheFullError, match="out of blocks"):
        for item in eng.generate(prompt, SamplingParams(max_new_tokens=100), SpecParams(k=4)):
            events.append(item)
    assert events  # it got going before running out
    assert eng.ids == prompt + [t.token_id for e in events for t in e.committed]
    assert eng.target_pool.manager.length(0) == len(eng.ids) - 1
    d = eng.model_drafter
    assert eng.ids[: len(d.cached)] == d.cached and d.pool.manager.length(0) == len(d.cached)
    eng.reset()  # and the engine can be used again
    *_, s = eng.generate(prompt, SamplingParams(max_new_tokens=5), SpecParams(k=4))
    assert s.new_tokens == 5


# ---- messages, prompt ids and SpecParams fields are checked where they enter -------------------
@pytest.mark.parametrize("messages, field", [
    ([{"role": "user", "content": 5}], r"messages\[0\]\['content'\] must be a string, got 5"),
    ([{"role": "user", "content": None}], r"messages\[0\]\['content'\] must be a string, got None"),
    ([{"role": "user"}], r"messages\[0\]\['content'\] is missing"),
    ([{"role": 3, "content": "hi"}], r"messages\[0\]\['role'\] must be a string"),
    ([{"role": "user", "content": "hi"}, "hello"], r"messages\[1\] must be a dict"),
    ([], r"messages is empty"),
    ("hello", r"messages must be a list"),
])
def test_bad_messages_name_the_field(engine, messages, field):
    with pytest.raises(ValueError, match=field):
        engine.encode_chat(messages)


def test_a_lone_surrogate_is_refused_by_name(engine):
    """It reached the tokenizer and failed there with a raw TypeError."""
    text = "a" + chr(0xD800) + "b"  # built here: pytest cannot print a failure report holding one
    with pytest.raises(ValueError, match=r"messages\[0\]\['content'\] holds a lone surrogate \(U\+D800\) at character 1"):
        engine.encode_chat([{"role": "user", "content": text}])


@pytest.mark.parametrize("prompt, field", [
    ([1.5], r"prompt_ids\[0\] must be an integer token id, got 1.5"),
    ([5, True], r"prompt_ids\[1\] must be an integer"),
    ("hello", r"prompt_ids must be a list of token ids"),
    (b"\x05", r"prompt_ids must be a list of token ids"),
])
def test_bad_prompt_ids_name_the_field(engine, prompt, field):
    engine.reset()
    with pytest.raises(ValueError, match=field):
        start(engine, prompt)
    assert_untouched(engine, [])
    assert start(engine, (5, 6, 7)).round == 1  # a tuple of ints is fine


@pytest.mark.parametrize("kw, field", [
    (dict(enabled="no"), r"SpecParams\.enabled must be True or False, got 'no'"),
    (dict(adaptive=1), r"SpecParams\.adaptive must be True or False"),
    (dict(k=10**9, k_max=10**9), r"SpecParams\.k_max must be in \[1, 64\], got 1000000000"),
    (dict(k=1, k_max=0), r"SpecParams\.k_max must be in \[1, 64\]"),
])
def test_bad_spec_fields_name_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        SpecParams(**kw)
    assert SpecParams(k=64, k_max=64).k == 64


# ---- reset() mid-reply, and the Summary ends the request ----------------------------------
def test_reset_mid_reply_is_refused_and_the_reply_finishes(engine):
    engine.reset()
    gen = engine.generate([5, 6, 7], SamplingParams(max_new_tokens=8), SpecParams(k=2))
    next(gen)
    with pytest.raises(RuntimeError, match="cannot reset the engine while a generate"):
        engine.reset()
    *_, summary = gen
    assert summary.new_tokens == 8
    assert engine.target_pool.manager.length(0) == len(engine.ids) - 1
    engine.reset()  # once it has ended, a reset is fine
    assert engine.ids == []


def test_a_consumer_that_stops_at_the_summary_frees_the_engine(engine):
    engine.reset()
    gen = engine.generate([5, 6, 7], GREEDY, SpecParams(k=2))
    summary = next(item for item in gen if not hasattr(item, "round"))  # stop reading at the Summary
    assert summary.new_tokens == 4
    *_, again = engine.generate(list(engine.ids), GREEDY, SpecParams(k=2))  # gen is still referenced
    assert again.new_tokens == 4
    engine.reset()
    gen.close()  # closing the finished request later touches nothing
    assert engine.ids == [] and engine.target_pool.manager.length(0) == 0
