"""scripts/bench/policy_ab.py: two settings of the policy and fixed modes take turns on the same prompts, the
settings hold for their own replies only, and the comparison is each kind's rates and ratios."""
import pytest

from engine.api.config import APP_DEFAULTS, SpecParams
from engine.spec import policy
from scripts.bench.policy_ab import Prompt, Variant, compare, constants, parse_sets, rate, run
from tests.engine.test_exactness import PROMPTS
from tests.tiny import tiny_engine


def test_settings_parse_as_the_constants_types_and_bad_ones_are_refused():
    assert parse_sets(["SWITCH_MARGIN=0.1", "EXPLORE_EVERY=8"]) == (("SWITCH_MARGIN", 0.1), ("EXPLORE_EVERY", 8))
    for bad in ("SWITCH_MARGIN", "NO_SUCH=1", "EXPLORE_EVERY=eight", "switch_margin=0.1"):
        with pytest.raises(ValueError, match="SWITCH_MARGIN|NO_SUCH|EXPLORE_EVERY|switch_margin"):
            parse_sets([bad])


def test_constants_are_restored_even_when_the_reply_fails():
    before = policy.SWITCH_MARGIN
    with pytest.raises(RuntimeError), constants([("SWITCH_MARGIN", before + 1.0)]):
        assert policy.SWITCH_MARGIN == before + 1.0
        raise RuntimeError("the reply failed")
    assert policy.SWITCH_MARGIN == before


def test_the_variants_take_turns_and_each_holds_its_own_settings():
    engine = tiny_engine()
    prompts = [Prompt(f"p{i}", kind, engine.encode_chat(m)) for i, (kind, m) in enumerate(zip(("a", "b"), PROMPTS))]
    seen = []  # (variant, SWITCH_MARGIN while its reply ran)
    generate = engine.generate

    def spy(ids, sampling, spec, *rest):
        seen.append(policy.SWITCH_MARGIN)
        return generate(ids, sampling, spec, *rest)

    engine.generate = spy
    said = []
    default = APP_DEFAULTS.spec_params()
    variants = [Variant("A", default), Variant("B", default, (("SWITCH_MARGIN", 0.75),)),
                Variant("draft K2", SpecParams(k=2, drafter="model", stop_below=default.stop_below))]
    tallies, identical = run(engine, prompts, variants, 2, 12, said.append)
    assert identical  # greedy: the policy's settings change the rounds, never the text
    order = [line.split()[1].rstrip(":") for line in said]
    assert order[:3] == ["A", "B", "draft"] and order[3:6] == ["B", "draft", "A"]  # the order moves on
    assert [m == 0.75 for m in seen] == [o == "B" for o in order]
    assert policy.SWITCH_MARGIN != 0.75
    for name in ("A", "B", "draft K2"):
        assert set(tallies[name]) == {"a", "b"} and all(t.replies == 2 for t in tallies[name].values())
    table = compare(tallies, ["draft K2"])
    row = table["a"]
    assert row["B / A"] == pytest.approx(rate(tallies["B"]["a"]) / rate(tallies["A"]["a"]))
    assert row["A / best fixed"] == pytest.approx(rate(tallies["A"]["a"]) / rate(tallies["draft K2"]["a"]))
    assert row["B / A low"] <= row["B / A"] <= row["B / A high"]  # two replies a kind: an interval of the pairs


def test_a_cost_constant_is_set_in_round_costs_where_the_costs_read_it():
    """--set PRIOR_ROW (engine.spec.round_costs) reaches the pricing; set on the policy module it would not."""
    from engine.spec import round_costs

    assert parse_sets(["PRIOR_ROW=0.4", "FIRST_TRIES=1"]) == (("PRIOR_ROW", 0.4), ("FIRST_TRIES", 1))
    fresh = policy.PolicyState()
    before = round_costs.pass_steps(fresh, 5)[0]
    with constants([("PRIOR_ROW", 0.4)]):
        assert round_costs.pass_steps(fresh, 5)[0] == pytest.approx(1 + 4 * 0.4)
        assert not hasattr(policy, "PRIOR_ROW")
    assert round_costs.pass_steps(fresh, 5)[0] == before
