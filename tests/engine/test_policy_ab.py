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


def test_the_variants_take_turns_round_by_round_each_with_its_own_settings():
    engine = tiny_engine()
    default = APP_DEFAULTS.spec_params()
    variants = [Variant("A", default), Variant("B", default, (("SWITCH_MARGIN", 0.75),)),
                Variant("draft K2", SpecParams(k=2, drafter="model", stop_below=default.stop_below))]
    engines = [engine] + [engine.twin() for _ in variants[1:]]
    prompts = [Prompt(f"p{i}", kind, engine.encode_chat(m)) for i, (kind, m) in enumerate(zip(("a", "b"), PROMPTS))]
    seen = []  # (variant, SWITCH_MARGIN) as each of its rounds ran

    def spy(e, name):
        generate = e.generate

        def rounds(ids, sampling, spec, *rest):
            for item in generate(ids, sampling, spec, *rest):
                seen.append((name, policy.SWITCH_MARGIN))
                yield item
        e.generate = rounds

    for e, v in zip(engines, variants):
        spy(e, v.name)
    said = []
    tallies, identical = run(engines, prompts, variants, 2, 12, said.append)
    assert identical  # greedy: the policy's settings change the rounds, never the text
    assert len(said) == 2 * len(prompts) * len(variants)
    assert {name for name, _ in seen} == {"A", "B", "draft K2"}
    assert all((margin == 0.75) == (name == "B") for name, margin in seen)  # B's constants for B's rounds only
    assert policy.SWITCH_MARGIN != 0.75
    switches = sum(a != b for (a, _), (b, _) in zip(seen, seen[1:]))
    assert switches > 2 * len(prompts) * len(variants)  # turns within a reply, not one whole reply after another
    for name in ("A", "B", "draft K2"):
        assert set(tallies[name]) == {"a", "b"} and all(t.replies == 2 for t in tallies[name].values())
    table = compare(tallies, ["draft K2"])
    row = table["a"]
    assert row["B / A"] == pytest.approx(rate(tallies["B"]["a"]) / rate(tallies["A"]["a"]))
    assert row["A / best fixed"] == pytest.approx(rate(tallies["A"]["a"]) / rate(tallies["draft K2"]["a"]))
    assert row["B / A low"] <= row["B / A"] <= row["B / A high"]  # two replies a kind: an interval of the pairs


def test_each_variant_needs_its_own_engine():
    engine = tiny_engine()
    with pytest.raises(ValueError, match="2 variants need as many engines"):
        run([engine], [], [Variant("A", APP_DEFAULTS.spec_params()), Variant("B", APP_DEFAULTS.spec_params())], 1, 4)


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
