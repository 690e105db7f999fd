"""engine.runtime.tally: the Summary's decode rate, on hand-made rounds (no torch)."""
import dataclasses

import pytest

from engine.runtime.tally import RoundTally
from engine.tools.specbench import decode_seconds
from tests.app_fixtures import make_round


def _with_catch_up(n: int, prefill_ms: float):
    return dataclasses.replace(make_round(n, ("a",), (), "b"), draft_prefill_ms=prefill_ms)


def test_the_decode_rate_leaves_out_only_the_draft_models_prompt_prefill():
    """The draft model's first catch-up of a reply reads the prompt (left out, as the target's prefill is); a later
    one reads text a plain round or the n-gram lookup committed, and is paid while decoding: the Summary's rate
    (Compare's figure) and Spec-Bench's decode_seconds count it the same way."""
    events = [_with_catch_up(1, 300.0), _with_catch_up(2, 0.0), _with_catch_up(3, 40.0), _with_catch_up(4, 60.0)]
    tally = RoundTally(prompt_tokens=50, prefill_s=0.5)
    for i, ev in enumerate(events):
        tally.add(ev, 0.6 + 0.1 * i)
    s = tally.summary(total_s=2.0, stop_reason="length")
    assert s.new_tokens == 8
    assert s.tokens_per_s == pytest.approx(8 / (2.0 - 0.5 - 0.3))
    assert s.draft_prefill_ms == pytest.approx(400.0)  # the CSV's column still sums every catch-up
    assert decode_seconds(events, s) == pytest.approx(8 / s.tokens_per_s)


def test_a_reply_whose_first_rounds_read_nothing_into_the_draft_model():
    """Under the hybrid the lookup may draft first: the draft model's prompt prefill is its first catch-up,
    whichever round that is."""
    events = [_with_catch_up(1, 0.0), _with_catch_up(2, 250.0), _with_catch_up(3, 50.0)]
    tally = RoundTally(prompt_tokens=50, prefill_s=0.25)
    for ev in events:
        tally.add(ev, 1.0)
    s = tally.summary(total_s=1.5, stop_reason="eos")
    assert s.tokens_per_s == pytest.approx(6 / (1.5 - 0.25 - 0.25))
