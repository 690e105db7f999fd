"""scripts.bench.turns_noise: its arguments and its per-kind summary (the run itself is a benchmark)."""
import math

import pytest

from engine.tools.specbench import Question, Tally
from scripts.bench.turns_noise import first_turns, parse_kinds, summarize


def test_kinds_are_named_with_counts_of_at_least_two():
    assert parse_kinds("translation=20,qa=3") == {"translation": 20, "qa": 3}
    for bad in ("translation", "qa=1", "qa=x"):
        with pytest.raises(ValueError, match="kind=N"):
            parse_kinds(bad)


def test_first_turns_of_each_kind_and_too_few_refused():
    qs = [Question(f"m{i}", "mt-bench", turns=("one", "two")) for i in range(4)] + [Question("q", "qa", turns=("a",))]
    got = first_turns(qs, {"mt-bench": 2})
    assert [q.turns for q in got] == [("one",), ("one",)] and all(q.category == "mt-bench" for q in got)
    with pytest.raises(ValueError, match="1 questions of kind 'qa', not 2"):
        first_turns(qs, {"qa": 2})


class Run:
    def __init__(self, seconds):
        self.categories = {"qa": Tally(per_reply=[(10, s) for s in seconds])}


def test_the_summary_is_b_over_a_its_per_reply_scatter_and_the_speedup():
    a, b, plain = Run([1.0, 2.0]), Run([0.5, 2.0]), Run([1.5, 3.0])
    row = summarize([a, b, plain], {"qa": 2})["qa"]
    assert row["b_over_a"] == pytest.approx(3.0 / 2.5) and row["speedup"] == pytest.approx(4.5 / 3.0)
    assert row["per_reply_log_sd"] == pytest.approx(math.log(2.0) / math.sqrt(2))
