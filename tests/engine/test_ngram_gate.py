"""The n-gram drafter proposes only what is likely to pass, and learns that from the committed text."""
import torch

from engine.api.config import SamplingParams
from engine.spec.drafters import NGramDrafter

GREEDY = SamplingParams()


def run(drafter: NGramDrafter, text: list[int], start: int, k: int = 8) -> list[int]:
    """Commit `text` one token at a time from `start` (as plain rounds would); the sizes of the proposals."""
    sizes = []
    for i in range(start, len(text)):
        sizes.append(len(drafter.propose(text[:i], k, GREEDY, None).tokens))
        drafter.rollback(text[: i + 1])
    return sizes


def test_repetitive_text_earns_long_proposals():
    d = NGramDrafter(100, torch.device("cpu"))
    unit = [5, 6, 7, 8, 9, 10, 11, 12]
    sizes = run(d, unit * 6, len(unit))
    assert sizes[:2] == [0, 1]  # no earlier occurrence yet; then the prior (a = 1/2) risks one token
    assert max(sizes[-8:]) == 8  # continuations keep passing: the whole K
    assert d.pass_rate(4) > 0.9


def test_misleading_matches_stop_being_proposed_and_can_come_back():
    d = NGramDrafter(100, torch.device("cpu"), n_min=1, n_max=1)
    noisy = [1, 2, 1, 3, 1, 4, 1, 5, 1, 6, 1, 7, 1, 8, 1, 9, 1, 10, 1, 11, 1, 12, 1, 13]  # "1" is followed by anything
    sizes = run(d, noisy, 2)
    assert d.pass_rate(1) < NGramDrafter.MIN_PASS
    assert sum(sizes[-8:]) == 0  # nothing proposed any more: rounds run as plain decode steps
    sizes = run(d, noisy[:4] + [1, 3] * 12, 4)  # now "1" is always followed by "3"
    assert sizes[-1] >= 1 and d.pass_rate(1) > 0.5


def test_a_new_conversation_forgets_the_estimates():
    d = NGramDrafter(100, torch.device("cpu"))
    run(d, [1, 2] * 10, 2)
    assert d.hits
    d.reset()
    assert not d.hits and not d.trials and d.pass_rate(2) == 0.5


def test_a_continuation_that_starts_right_goes_on_right():
    """Copied spans: "5 1" is always followed by the span, "6 1" by tokens never seen again, so a 2-token match's
    first follower is right one time in two and, once it is, the rest of the span follows. Each position's own rate
    sees that; a_n^i would have the later tokens fail as often as the first."""
    d = NGramDrafter(1000, torch.device("cpu"), n_min=2, n_max=2)
    span = [7, 8, 9, 10, 11, 12]
    text = []
    for i in range(30):
        text += [5, 1, *span, 300 + i] if i % 2 else [6, 1, 100 + i, 200 + i]
    for i in range(1, len(text)):
        if text[i - 1] == 1:  # look up after every "1" only, and score the whole continuation
            d.lookup(text[:i], 6)
            d.rollback(text[: i + 6])
    chain = d.chain(2, 6)
    a = d.pass_rate(2)
    assert 0.35 < chain[0] < 0.65  # the first follower: right one time in two
    assert chain[5] / chain[0] > 0.8 > a ** 5  # then the span: nearly always whole
    assert list(chain) == sorted(chain, reverse=True)
    d.reset()
    assert not d.reached and not d.passed and d.chain(2, 2) == (0.5, 0.25)
