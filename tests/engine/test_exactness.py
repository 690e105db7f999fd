"""Speculative decoding is lossless: token-identical under greedy, distribution-identical under sampling."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from engine.api.config import CacheConfig, SamplingParams, SpecParams
from engine.api.events import Origin, Summary
from engine.model.kv_cache import BlockManager, KVPool
from engine.model.transformer import Transformer
from engine.runtime.engine import Engine
from engine.spec.drafters import HybridDrafter
from engine.spec.sampling import probs_for_positions, probs_from_logits
from tests.tiny import (
    ENGINE_CFG,
    draft_weights,
    hf_model,
    model_config,
    state_dict,
    tiny_engine,
    tiny_tokenizer,
)

PROMPTS = [
    [{"role": "user", "content": "hello there, how are you?"}],
    [{"role": "user", "content": "def f(x): return x + 1"}],
    [{"role": "user", "content": "abcabcabcabc"}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2=?"}],
    [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello!"}, {"role": "user", "content": "again"}],
    [{"role": "user", "content": "The quick brown fox jumps over the lazy dog."}],
]


def run(engine: Engine, prompt: list[int], sampling: SamplingParams, spec: SpecParams) -> Summary:
    *_, summary = engine.generate(prompt, sampling, spec)
    assert isinstance(summary, Summary)
    return summary


def greedy_identity(engine: Engine, drafter: str, k: int) -> tuple[int, int, int, int]:
    """Greedy speculation equals plain greedy on every prompt. -> drafted, accepted, rounds, tokens (speculative)."""
    greedy = SamplingParams(temperature=0.0, max_new_tokens=40)
    drafted = accepted = rounds = tokens = 0
    for messages in PROMPTS:
        prompt = engine.encode_chat(messages)
        engine.reset()
        plain = run(engine, prompt, greedy, SpecParams(enabled=False))
        engine.reset()
        spec = run(engine, prompt, greedy, SpecParams(k=k, drafter=drafter))
        assert spec.token_ids == plain.token_ids, messages
        assert spec.text == plain.text
        assert plain.rounds == plain.new_tokens  # plain: one token per target pass
        drafted, accepted = drafted + spec.drafted, accepted + spec.accepted
        rounds, tokens = rounds + spec.rounds, tokens + spec.new_tokens
    return drafted, accepted, rounds, tokens


@pytest.fixture(scope="module")
def engine() -> Engine:
    return tiny_engine()


@pytest.mark.parametrize("drafter", ["model", "ngram", "hybrid"])
@pytest.mark.parametrize("k", [1, 3, 8])
def test_greedy_speculative_equals_plain(engine, drafter, k):
    drafted, accepted, rounds, tokens = greedy_identity(engine, drafter, k)
    assert drafted > 0 and accepted > 0
    if drafter == "model":  # the noisy-copy draft agrees often: rounds really carried several tokens
        assert tokens / rounds > 1.5


# --- sampling exactness ----------------------------------------------------------------------------

N_DRAWS = 20_000


def small_pair() -> tuple[Transformer, Transformer, object]:
    """A one-layer target (cheap enough for 20,000 requests) and a noisy copy as its draft (alpha ~0.45)."""
    cfg_dict = dict(ENGINE_CFG, num_hidden_layers=1)
    sd = state_dict(hf_model(cfg_dict, 3))
    cfg = model_config(cfg_dict)
    target = Transformer.from_state_dict(cfg, sd, torch.float32, "cpu", 256)
    draft = Transformer.from_state_dict(cfg, draft_weights(sd, 0.05, 4), torch.float32, "cpu", 256)
    return target, draft, tiny_tokenizer()


def ngram_friendly_prompt(engine: Engine, target: Transformer, params: SamplingParams) -> list[int]:
    """A chat whose earlier assistant turn starts with a token the target finds plausible (p near 0.5)
    at the point where the n-gram drafter will propose it, so both accept and reject happen often."""
    best, best_gap = None, 2.0
    for c in "abcdefghijklmnopqrstuvwxyz0123456789 .,!?":
        prompt = engine.encode_chat([{"role": "user", "content": "hi"}, {"role": "assistant", "content": c + "k"},
                                     {"role": "user", "content": "and?"}])
        p = float(next_probs(target, prompt, params)[engine.tokenizer.convert_tokens_to_ids(c)])
        if abs(p - 0.5) < best_gap:
            best, best_gap = prompt, abs(p - 0.5)
    assert best is not None
    return best


def next_probs(model: Transformer, ids: list[int], params: SamplingParams) -> torch.Tensor:
    """The model's sampling distribution after ids, from a fresh cache (on the CPU, whatever device it ran on)."""
    w = next(model.parameters())
    pool = KVPool(model.cfg.num_layers, model.cfg.num_kv_heads, model.cfg.head_dim, BlockManager(32, 8, 256),
                  model.kv_dtype or w.dtype, w.device)
    pool.manager.allocate(0)
    start, end = pool.manager.append(0, len(ids))
    x = torch.tensor(ids, device=w.device)
    logits = model(x, start, pool.view(0, start, end), last_only=True)[0]
    return probs_from_logits(logits, params, x).cpu()


def joint_two(model: Transformer, prompt: list[int], params: SamplingParams) -> dict[tuple[int, int], float]:
    p1 = next_probs(model, prompt, params)
    out = {}
    for a in torch.nonzero(p1 > 1e-7).flatten().tolist():
        p2 = next_probs(model, prompt + [a], params)
        for b in torch.nonzero(p2 > 1e-7).flatten().tolist():
            out[(a, b)] = float(p1[a] * p2[b])
    return out


def chi2_pvalue(counts: dict[tuple[int, int], int], expected: dict[tuple[int, int], float], n: int) -> float:
    """Pearson chi-square over the cells with expected count >= 5, all other cells pooled into one bin."""
    big = [c for c, pr in expected.items() if pr * n >= 5]
    obs = [counts.get(c, 0) for c in big]
    exp = [expected[c] * n for c in big]
    rest_obs, rest_exp = n - sum(obs), n - sum(exp)
    if rest_exp >= 5:
        obs.append(rest_obs)
        exp.append(rest_exp)
    else:
        exp[-1] += rest_exp
        obs[-1] += rest_obs
    assert len(big) >= 8, "too few cells for a meaningful test"
    return float(chisquare(obs, exp).pvalue)


def quantized_pair(folder) -> tuple[Transformer, Transformer, object]:
    """small_pair's target and draft written as Q8_0 GGUFs and run through the quantized kernels."""
    from engine.io.gguf_file import GGUFFile
    from engine.io.gguf_model import build_model
    from tests.engine.test_weights import write_gguf

    cfg_dict = dict(ENGINE_CFG, num_hidden_layers=1)
    hf = hf_model(cfg_dict, 3)
    target = build_model(GGUFFile(write_gguf(folder / "target.gguf", hf, None, "Q8_0")), 256)
    hf.load_state_dict(draft_weights(dict(hf.state_dict()), 0.05, 4))
    draft = build_model(GGUFFile(write_gguf(folder / "draft.gguf", hf, None, "Q8_0")), 256)
    return target, draft, tiny_tokenizer()


def test_greedy_speculative_equals_plain_when_the_draft_stops_early(engine):
    greedy = SamplingParams(temperature=0.0, max_new_tokens=40)
    drafted = {0.0: 0, 0.5: 0}
    for messages in PROMPTS:
        prompt = engine.encode_chat(messages)
        engine.reset()
        plain = run(engine, prompt, greedy, SpecParams(enabled=False))
        for stop in drafted:
            engine.reset()
            spec = run(engine, prompt, greedy, SpecParams(k=6, stop_below=stop))
            assert spec.token_ids == plain.token_ids
            drafted[stop] += spec.drafted
    assert drafted[0.5] < 0.8 * drafted[0.0]  # the drafts really stopped early


def test_the_stop_rule_reads_the_drafts_own_probability_of_its_token():
    """Under greedy (q a point mass) the draft's confidence is its softmax at T = 1; when sampling, q itself."""
    from engine.spec.drafters.model import confidence

    logits = torch.tensor([2.0, 0.5, -1.0, float("-inf")])
    point = torch.tensor([0.0, 1.0, 0.0, 0.0])
    want = math.exp(0.5) / (math.exp(2.0) + math.exp(0.5) + math.exp(-1.0))
    assert confidence(logits, point, 1, greedy=True) == pytest.approx(want, rel=1e-6)
    q = torch.tensor([0.6, 0.3, 0.1, 0.0])
    assert confidence(logits, q, 1, greedy=False) == pytest.approx(0.3)


@pytest.mark.parametrize("drafter", ["model", "ngram"])
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_sampling_distribution_is_exact(drafter, temperature, top_p):
    assert_exact_distribution(*small_pair(), drafter, temperature, top_p)


def test_hybrid_rounds_mix_and_stay_exact(engine, monkeypatch):
    """With the hybrid's bar at 0 every n-gram match drafts, so n-gram and model rounds alternate: the model's
    cache then catches up on tokens it never drafted. Greedy output must still equal plain."""
    monkeypatch.setattr(HybridDrafter, "MIN_EXPECTED", 0.0)
    greedy = SamplingParams(temperature=0.0, max_new_tokens=40)
    sources: dict[str, int] = {}
    for messages in PROMPTS:
        prompt = engine.encode_chat(messages)
        engine.reset()
        plain = run(engine, prompt, greedy, SpecParams(enabled=False))
        engine.reset()
        events = list(engine.generate(prompt, greedy, SpecParams(k=3, drafter="hybrid")))
        assert events[-1].token_ids == plain.token_ids
        for ev in events[:-1]:
            if ev.drafted:
                sources[ev.drafter] = sources.get(ev.drafter, 0) + 1
    assert set(sources) == {"model", "ngram"} and min(sources.values()) >= 5, sources


def test_sampling_distribution_is_exact_with_the_hybrid_drafter(monkeypatch):
    """K = 1, the n-gram drafting first: when its token is rejected, the second token comes from a round the
    model may draft after catching up on the correction. Both scored tokens must follow the target."""
    monkeypatch.setattr(HybridDrafter, "MIN_EXPECTED", 0.0)
    assert_exact_distribution(*small_pair(), "hybrid", 1.0, 1.0, SpecParams(k=1, drafter="hybrid"))


def test_sampling_distribution_is_exact_on_quantized_models(tmp_path):
    """The verify pass through the quantized kernels scores K+1 rows exactly as the reference forward does."""
    assert_exact_distribution(*quantized_pair(tmp_path), "model", 1.0, 1.0)


def test_sampling_distribution_is_exact_with_a_trimmed_draft_head(tmp_path):
    """A draft whose LM head scores only part of the vocabulary (q = 0 elsewhere) changes acceptance, never
    the output distribution."""
    from engine.io.gguf_file import GGUFFile
    from engine.io.gguf_model import build_model

    target, draft, tok = quantized_pair(tmp_path)
    keep = np.arange(0, target.cfg.vocab_size, 2)  # every other token: plenty of mass outside the head
    trimmed = build_model(GGUFFile(tmp_path / "draft.gguf"), 256, head_rows=keep)
    q = next_probs(trimmed, [1, 5, 9], SamplingParams(temperature=1.0))
    assert q[1::2].sum() == 0 and abs(float(q.sum()) - 1) < 1e-5
    assert_exact_distribution(target, trimmed, tok, "model", 1.0, 1.0)


def assert_exact_distribution(target: Transformer, draft: Transformer, tok, drafter: str, temperature: float,
                              top_p: float, spec: SpecParams | None = None, top_k: int = 0,
                              draws: int = N_DRAWS) -> dict[int, int]:
    """-> how many first rounds drafted each number of tokens."""
    # No EOS, so every request yields its first two tokens.
    engine = Engine(target, tok, draft, cache=CacheConfig(block_size=8, max_seq_len=256), eos_ids=set())
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, max_new_tokens=3)
    # An earlier assistant turn gives the n-gram drafter something to look up after "assistant:".
    prompt = ngram_friendly_prompt(engine, target, params)
    spec = spec or SpecParams(k=2, drafter=drafter)
    counts: dict[tuple[int, int], int] = {}
    lengths: dict[int, int] = {}
    first_drafted = first_accepted = 0
    for seed in range(draws):
        events = list(engine.generate(prompt, params.with_(seed=seed), spec))
        ids = events[-1].token_ids
        counts[ids[0], ids[1]] = counts.get((ids[0], ids[1]), 0) + 1
        first = events[0]
        lengths[len(first.drafted)] = lengths.get(len(first.drafted), 0) + 1
        if first.drafted:
            first_drafted += 1
            first_accepted += first.drafted[0].accepted

    expected = joint_two(target, prompt, params)
    assert chi2_pvalue(counts, expected, draws) > 1e-3
    # Power check: the same samples are clearly NOT distributed like the draft model's own samples.
    if drafter == "model":
        assert chi2_pvalue(counts, joint_two(draft, prompt, params), draws) < 1e-6

    # The first draft's acceptance rate matches alpha = sum_x min(p(x), q(x)).
    p1 = next_probs(target, prompt, params)
    if drafter == "model":
        q1 = next_probs(draft, prompt, params)
    else:
        q1 = torch.zeros_like(p1)
        q1[engine.ngram_drafter.propose(prompt, 2, params, None).tokens[0]] = 1.0
    alpha = float(torch.minimum(p1, q1).sum())
    assert first_drafted == draws
    assert abs(first_accepted / first_drafted - alpha) < 0.02
    assert 0.05 < alpha < 0.98  # both outcomes actually occur
    return lengths


def test_sampling_distribution_is_exact_when_the_draft_stops_early():
    """stop_below ends a draft after its first token when q(t1) < X: the round then verifies one token and draws
    the bonus from the second row. X is picked so about half the first rounds stop; the output must not care."""
    target, draft, tok = small_pair()
    params = SamplingParams(temperature=1.0, max_new_tokens=3)
    engine = Engine(target, tok, draft, cache=CacheConfig(block_size=8, max_seq_len=256), eos_ids=set())
    q1 = next_probs(draft, ngram_friendly_prompt(engine, target, params), params)
    qs = q1[q1 > 0].sort().values  # P(stop) = sum of q(t) over t with q(t) < X
    below = qs.cumsum(0)
    i = max(1, int(torch.searchsorted(below, torch.tensor(0.5))))
    x = float(qs[i - 1] + qs[i]) / 2  # between two q values: rounding cannot move a token across it
    p_stop = float(q1[q1 < x].sum())
    assert 0.2 < p_stop < 0.8
    lengths = assert_exact_distribution(target, draft, tok, "model", 1.0, 1.0, SpecParams(k=2, stop_below=x))
    assert set(lengths) == {1, 2}
    assert abs(lengths[1] / N_DRAWS - p_stop) < 0.02  # the stop follows the draft's own q(t1)


# --- repetition penalty, the bonus token, top-k and a second temperature ---------------------------------------

PENALTY = 1.3


@pytest.mark.parametrize("drafter", ["model", "ngram"])
@pytest.mark.parametrize("k", [1, 4])
def test_greedy_speculative_equals_plain_with_repetition_penalty(engine, drafter, k):
    """The verify pass must penalise each drafted token for the tokens drafted before it, as plain decoding
    penalises them once they are committed."""
    greedy = SamplingParams(temperature=0.0, max_new_tokens=40, repetition_penalty=PENALTY)
    accepted = 0
    for messages in PROMPTS[:4]:
        prompt = engine.encode_chat(messages)
        engine.reset()
        plain = run(engine, prompt, greedy, SpecParams(enabled=False))
        engine.reset()
        spec = run(engine, prompt, greedy, SpecParams(k=k, drafter=drafter))
        assert spec.token_ids == plain.token_ids
        accepted += spec.accepted
    assert accepted > 0


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=1.3, top_k=12),
    SamplingParams(temperature=0.7, top_p=0.9),
    SamplingParams(temperature=1.0, repetition_penalty=PENALTY),
    SamplingParams(temperature=0.5, top_k=5, top_p=0.8, repetition_penalty=1.5),
    SamplingParams(temperature=0.0, repetition_penalty=PENALTY),
], ids=["T1.3-topk", "T0.7-topp", "penalty", "all", "greedy-penalty"])
def test_verify_rows_equal_the_per_position_transform(params):
    """Row i of the verify pass is the distribution after context + drafted[:i], whichever code path
    (batched when there is no penalty, per row otherwise) computes it. Cheap, and exact to rounding."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, ENGINE_CFG["vocab_size"], generator=g) * 3
    context, drafted = torch.tensor([3, 7, 7, 20]), torch.tensor([7, 50, 51, 20])
    rows = probs_for_positions(logits, params, context, drafted)
    for i in range(len(logits)):
        want = probs_from_logits(logits[i], params, torch.cat([context, drafted[:i]]))
        torch.testing.assert_close(rows[i], want, rtol=0, atol=1e-6)


N_DRAWS_K1 = 6_000  # ample power against planted bugs (p < 1e-15); a quarter of the cost of N_DRAWS


@pytest.mark.parametrize("drafter,temperature,top_p,top_k,penalty", [
    ("model", 1.3, 1.0, 12, 1.5),  # top-k, a temperature above 1 and a repetition penalty
    ("ngram", 0.5, 1.0, 0, 1.0),  # the point-mass drafter, below 1 (top-p would blunt a wrong-T bonus here)
])
def test_bonus_token_is_distributed_exactly(drafter, temperature, top_p, top_k, penalty):
    """K = 1 with two tokens scored: when the draft passes, the second token is the bonus, drawn from the
    verify pass's last position. (At K = 2 with two tokens scored the bonus is never looked at.)"""
    target, draft, tok = small_pair()
    engine = Engine(target, tok, draft, cache=CacheConfig(block_size=8, max_seq_len=256), eos_ids=set())
    params = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k, repetition_penalty=penalty,
                            max_new_tokens=2)
    prompt = ngram_friendly_prompt(engine, target, params)
    spec = SpecParams(k=1, drafter=drafter)
    counts: dict[tuple[int, int], int] = {}
    bonus = 0
    for seed in range(N_DRAWS_K1):
        # Each draw is a first request: the n-gram drafter would otherwise learn across the replays of this one
        # prompt how often its guess passes, and stop proposing it (see NGramDrafter).
        engine.ngram_drafter.reset()
        *events, summary = engine.generate(prompt, params.with_(seed=seed), spec)
        ids = summary.token_ids
        counts[ids[0], ids[1]] = counts.get((ids[0], ids[1]), 0) + 1
        bonus += events[0].committed[-1].origin is Origin.BONUS
    assert 0.1 * N_DRAWS_K1 < bonus < 0.95 * N_DRAWS_K1  # the bonus path carries a good share of the draws

    expected = joint_two(target, prompt, params)
    assert chi2_pvalue(counts, expected, N_DRAWS_K1) > 1e-3
    if drafter == "model":  # power: clearly not the draft's own distribution
        assert chi2_pvalue(counts, joint_two(draft, prompt, params), N_DRAWS_K1) < 1e-6
