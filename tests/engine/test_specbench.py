"""engine.tools.specbench: Spec-Bench's question format and this project's, and the per-category counts."""
import json

import pytest

from engine.api.events import DraftToken, RoundEvent, Summary
from engine.tools.specbench import Question, Tally, per_category, question, read_questions


def test_spec_bench_and_project_formats_read_alike(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text("\n".join([
        json.dumps({"question_id": 81, "category": "writing", "turns": ["First.", "Second."]}),
        "",
        json.dumps({"id": "code-fib", "kind": "code", "messages": [{"role": "user", "content": "fib?"}]}),
    ]))
    a, b = read_questions(path)
    assert a == Question("81", "mt-bench", turns=("First.", "Second."))  # MT-bench's sub-category: one kind
    assert b == Question("code-fib", "code", messages=({"role": "user", "content": "fib?"},))


def test_spec_bench_reports_mt_bench_as_one_kind_and_the_others_by_name():
    kinds = [question({"question_id": i, "category": c, "turns": ["t"]}).category
             for i, c in enumerate(("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
                                    "humanities", "translation", "qa", "math_reasoning", "rag", "summarization"))]
    assert kinds == ["mt-bench"] * 8 + ["translation", "qa", "math_reasoning", "rag", "summarization"]


def test_a_subset_spreads_through_each_category_in_the_file_order():
    qs = ([Question(f"w{i}", "rag" if i < 8 else "summarization", turns=("t",)) for i in range(12)]
          + [Question(f"q{i}", "qa", turns=("t",)) for i in range(3)])
    mixed = [qs[i] for i in (0, 12, 1, 2, 13, 3, 4, 5, 6, 7, 14, 8, 9, 10, 11)]  # categories interleaved
    picked = per_category(mixed, 4)
    assert [q.id for q in picked] == ["w0", "q0", "w2", "q1", "w4", "w6", "q2", "w8", "w9", "w10", "w11"]
    assert per_category(qs, 100) == qs  # fewer than asked: every one, as in the file
    with pytest.raises(ValueError, match="at least one question"):
        per_category(qs, 0)


@pytest.mark.parametrize("row, says", [
    ({"question_id": 1, "category": "qa", "turns": []}, "'turns' must be a non-empty list"),
    ({"question_id": 1, "category": "qa", "turns": ["ok", 3]}, "'turns' must be a non-empty list"),
    ({"question_id": 1, "turns": ["ok"]}, "needs a 'category'"),
    ({"category": "qa", "turns": ["ok"]}, "needs a 'question_id'"),
    ({"question_id": 1, "category": "qa", "turns": ["t"] * 17}, "17 turns; at most 16"),
    ({"id": "x", "messages": [{"role": "robot", "content": "hi"}]}, "message 1 must be"),
    ({"id": "x"}, "needs 'turns' (Spec-Bench) or a non-empty 'messages' list"),
    ([1, 2], "expected a JSON object"),
])
def test_a_bad_question_is_named(row, says):
    with pytest.raises(ValueError, match=says.replace("(", r"\(").replace(")", r"\)")):
        question(row)


def test_a_bad_line_names_its_number(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": ["ok"]}) + "\n{not json\n")
    with pytest.raises(ValueError, match="line 2"):
        read_questions(path)


def _round(n: int, drafted: list[bool], committed: int) -> RoundEvent:
    draft = tuple(DraftToken(i, "x", 0.5, 0.5, ok) for i, ok in enumerate(drafted))
    return RoundEvent(round=n, mode="speculative", drafter="model", k=len(drafted), temperature=0.0, drafted=draft,
                      committed=(), text_delta="", draft_ms=1.0, verify_ms=2.0, elapsed_s=0.0,
                      new_tokens=committed, stop_reason=None)


def _summary(new_tokens: int, total_s: float, prefill_s: float) -> Summary:
    return Summary(new_tokens=new_tokens, rounds=0, target_forwards=0, drafted=0, accepted=0, acceptance_rate=0.0,
                   mean_tokens_per_round=0.0, per_position_acceptance=(), tokens_per_s=0.0, ttft_s=0.0,
                   total_s=total_s, prompt_tokens=1, reused_prefix_tokens=0, draft_ms=0.0, verify_ms=0.0,
                   stop_reason="length", text="", prefill_s=prefill_s)


def test_tally_counts_as_spec_bench_and_vllm_define_them():
    """Mean accepted length is tokens per target pass; acceptance per position counts only rounds that drafted
    that position; the rate leaves the prompt's prefill out; the speedup is against the plain tally given."""
    t = Tally()
    t.add([_round(1, [True, True, False], 3), _round(2, [True], 2), _round(3, [False, False], 1)],
          _summary(new_tokens=6, total_s=2.5, prefill_s=0.5))
    assert t.mean_accepted_length == 2.0
    assert t.acceptance_rate == 3 / 6
    assert t.per_position == [2 / 3, 1 / 2, 0.0]
    assert t.tokens_per_s == 3.0
    plain = Tally(new_tokens=6, decode_s=4.0, rounds=6)
    assert t.figures(plain)["speedup"] == 2.0 and plain.figures(plain)["mean_accepted_length"] == 1.0
    both = Tally()
    both.merge(t)
    both.merge(t)
    assert both.per_position == t.per_position and both.rounds == 6 and both.tokens_per_s == t.tokens_per_s
    assert (t.replies, both.replies, both.figures(None)["replies"]) == (1, 2, 2)


def test_a_top_up_asks_the_short_kinds_again_until_each_holds_enough_tokens():
    """After two passes a translation holds 30 tokens and a summary 250: with --min-tokens 100 the translation's two
    questions are asked five more times each (30 + 5 x 15 >= 100), the summary not at all; the cap on passes wins."""
    from engine.tools.specbench import top_up

    qs = [Question("t1", "translation", turns=("a",)), Question("s1", "summarization", turns=("b",)),
          Question("t2", "translation", turns=("c",))]
    counted = {"translation": Tally(new_tokens=30, replies=4), "summarization": Tally(new_tokens=250)}
    extra = top_up(qs, 2, counted, 100, 100)
    assert sorted(q.id for q in extra) == ["t1"] * 5 + ["t2"] * 5
    assert top_up(qs, 2, counted, 30, 100) == [] and top_up(qs, 2, counted, 0, 100) == []
    assert sorted(q.id for q in top_up(qs, 2, counted, 10_000, 4)) == ["s1"] * 2 + ["t1"] * 2 + ["t2"] * 2


def _timed(replies: list[tuple[int, float]]) -> Tally:
    t = Tally()
    for n, s in replies:
        t.new_tokens, t.decode_s, t.replies = t.new_tokens + n, t.decode_s + s, t.replies + 1
        t.per_reply.append((n, s))
    return t


def test_the_default_is_set_against_the_fastest_other_mode_with_an_interval():
    """On replies whose times are exact multiples the ratio is exact and its interval closes on it; the fastest
    other mode is named, plain is never one of them, and the geomean is over the categories' speedups."""
    from engine.tools.specbench import versus_best

    base = [(10, 1.0), (20, 2.5), (5, 0.4)]

    def mode(factor: float) -> Tally:  # `factor` times plain's speed on every reply
        return _timed([(n, s / factor) for n, s in base])

    tallies = {"plain": {"qa": mode(1.0), "math": mode(1.0)},
               "draft K=4": {"qa": mode(1.2), "math": mode(1.5)},
               "ngram K=4": {"qa": mode(1.1), "math": mode(1.6)},
               "default": {"qa": mode(1.08), "math": mode(1.6)}}
    v = versus_best(tallies, "default", "plain", draws=200)
    assert v["qa"]["best"] == "draft K=4" and v["math"]["best"] == "ngram K=4"
    assert v["qa"]["ratio"] == pytest.approx(0.9) and v["qa"]["low"] == v["qa"]["high"] == pytest.approx(0.9)
    assert v["math"]["ratio"] == pytest.approx(1.0)
    assert v["qa"]["plain"]["ratio"] == v["qa"]["plain"]["low"] == pytest.approx(1.08)  # the other bar: >= plain
    assert v["math"]["plain"]["high"] == pytest.approx(1.6) and "plain" not in v["geomean"]
    # geomean speedups: default sqrt(1.08 x 1.6), draft K=4 sqrt(1.2 x 1.5), n-gram sqrt(1.1 x 1.6)
    assert v["geomean"]["best"] == "draft K=4"
    assert v["geomean"]["ratio"] == pytest.approx((1.08 * 1.6 / (1.2 * 1.5)) ** 0.5, abs=1e-4)
    assert versus_best({"plain": tallies["plain"], "default": tallies["default"]}, "default", "plain") == {}


def test_the_interval_is_of_the_pair_on_the_same_replies():
    """Each reply timed in a minute that slows every mode alike (shared) cancels from the ratio: the interval is
    tight around the true 0.98. Scatter of each mode's own (apart) widens it, around the run's own ratio. A
    category whose modes hold different replies is left out."""
    import random

    from engine.tools.specbench import versus_best

    rng = random.Random(1)
    minute = [rng.uniform(0.8, 1.25) for _ in range(12)]

    def mode(speed: float, shared: bool) -> Tally:
        return _timed([(10, (minute[i] if shared else rng.uniform(0.8, 1.25)) / speed) for i in range(12)])

    together = {"plain": {"qa": mode(1.0, True)}, "draft K=4": {"qa": mode(1.2, True)},
                "default": {"qa": mode(1.2 * 0.98, True)}}
    apart = {"plain": {"qa": mode(1.0, False)}, "draft K=4": {"qa": mode(1.2, False)},
             "default": {"qa": mode(1.2 * 0.98, False)}}
    a, b = versus_best(apart, "default", "plain")["qa"], versus_best(together, "default", "plain")["qa"]
    assert b["low"] == pytest.approx(0.98) and b["high"] == pytest.approx(0.98), b
    assert a["low"] < a["ratio"] < a["high"] and a["high"] - a["low"] > 0.05, a
    apart["default"]["math"] = _timed([(10, 1.0)])
    for m in ("plain", "draft K=4"):
        apart[m]["math"] = _timed([(10, 1.0), (10, 1.0)])
    assert "math" not in versus_best(apart, "default", "plain")
    from engine.tools.specbench import paired_ratio

    assert paired_ratio(apart["default"]["math"], apart["plain"]["math"]) is None  # 1 reply against 2: no pairs
    assert paired_ratio(Tally(), Tally()) is None
    ratio, drawn = paired_ratio(together["default"]["qa"], together["draft K=4"]["qa"], draws=50)
    assert ratio == pytest.approx(0.98) and len(drawn) == 50


def test_held_out_picks_the_fastest_mode_on_other_replies_than_it_times():
    """Four fixed modes as fast as the default except each on one lucky reply of its own (twice as fast there): on
    the whole run the luckiest looks faster than the default, yet picked on one half and timed on the other, a
    mode's luck never follows it, and the default is exactly as fast. A mode truly faster on every reply is still
    found (held out, the default is at its 0.9 too)."""
    from engine.tools.specbench import held_out, versus_best

    base = [(10, 1.0)] * 4

    def lucky(i: int) -> Tally:
        return _timed([(n, s / 2 if j == i else s) for j, (n, s) in enumerate(base)])

    others = {f"m{i}": lucky(i) for i in range(4)}
    default = _timed(base)
    v = versus_best({"plain": {"qa": _timed(base)}, "default": {"qa": default},
                     **{m: {"qa": t} for m, t in others.items()}}, "default", "plain", draws=100)
    assert v["qa"]["ratio"] == pytest.approx(3.5 / 4)  # against a column whose lucky reply is in the run
    assert v["qa"]["held_out"] == pytest.approx(1.0)
    faster = {**others, "fast": _timed([(n, s / 2.5) for n, s in base])}
    assert held_out(_timed([(n, s / 2.25) for n, s in base]), faster) == pytest.approx(0.9)
    assert held_out(_timed(base[:1]), {"a": _timed(base[:1])}) is None  # one reply: nothing to hold out
    assert held_out(default, {"a": _timed(base[:3])}) is None  # replies that do not pair up
