"""Stop strings, EOS and the length budget: StopChecker on its own, then the engine discarding what follows."""
from __future__ import annotations

import random

import pytest

from engine.api.config import SamplingParams, SpecParams
from engine.api.events import RoundEvent, Summary
from engine.runtime.stops import StopChecker
from tests.tiny import tiny_engine

# --- StopChecker --------------------------------------------------------------------------------------


def feed_all(checker: StopChecker, pieces: list[str]) -> tuple[str, bool, int]:
    """Feed pieces until a hit; returns (emitted text, hit, index of the piece that hit or -1)."""
    out = []
    for i, piece in enumerate(pieces):
        text, hit = checker.feed(piece)
        out.append(text)
        if hit:
            return "".join(out), True, i
    return "".join(out), False, -1


def test_no_stops_passes_through():
    c = StopChecker(())
    assert c.feed("abc") == ("abc", False)
    assert c.flush() == ""
    c = StopChecker(("",))  # empty stop strings are ignored, not matched everywhere
    assert c.feed("abc") == ("abc", False)


def test_stop_string_across_token_pieces():
    c = StopChecker(("END",))
    assert c.feed("abE") == ("ab", False)  # "E" might start "END": held back
    assert c.feed("N") == ("", False)
    assert c.feed("Dxyz") == ("", True)  # completed: nothing of "END" (or after it) is emitted


def test_stop_inside_one_piece_cuts_there():
    c = StopChecker(("STOP",))
    assert c.feed("abcSTOPdef") == ("abc", True)


def test_held_back_text_is_released_when_it_cannot_be_a_stop():
    c = StopChecker(("END",))
    assert c.feed("xE") == ("x", False)
    assert c.feed("Nx") == ("ENx", False)
    assert c.pending == ""


def test_held_back_text_released_by_flush():
    c = StopChecker(("END",))
    assert c.feed("abEN") == ("ab", False)
    assert c.flush() == "EN"
    assert c.flush() == ""
    assert c.feed("D") == ("D", False)  # after a flush the old prefix is gone


def test_overlapping_self_prefix():
    c = StopChecker(("aab",))
    assert feed_all(c, list("xaaab")) == ("xa", True, 4)


def test_earliest_stop_among_several():
    text = "hello world"
    for stops in [("world", "lo w"), ("lo w", "world"), ("d", "lo w", "zzz")]:
        assert feed_all(StopChecker(stops), [text])[:2] == ("hel", True)
        assert feed_all(StopChecker(stops), list(text))[:2] == ("hel", True)
    # The stop that completes first wins even when a longer one would have started earlier.
    assert feed_all(StopChecker(("abcz", "bc")), list("abcz")) == ("a", True, 2)


@pytest.mark.parametrize("seed", range(5))
def test_random_pieces(seed):
    rng = random.Random(seed)
    alphabet = "abc"
    for _ in range(200):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        stops = tuple({"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))) for _ in range(rng.randint(1, 3))})
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, max(0, len(text) - 1)))) if len(text) > 1 else []
        pieces = [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]
        c = StopChecker(stops)
        out, hit, at = feed_all(c, pieces)
        assert text.startswith(out)
        # First position at which any stop string is complete.
        ends = [text.find(s) + len(s) for s in stops if s in text]
        if not ends:
            assert not hit
            assert out + c.flush() == text  # nothing lost, nothing invented
            continue
        assert hit
        first_end = min(ends)
        piece_end = sum(len(p) for p in pieces[: at + 1])
        assert piece_end >= first_end > piece_end - len(pieces[at])  # reported on the piece completing it
        assert any(text[len(out):].startswith(s) for s in stops)  # cut right at a stop string
        assert not any(s in out for s in stops)
        if all(len(p) == 1 for p in pieces):  # char by char: cut at the longest stop ending there
            longest = max(len(s) for s in stops if text[:first_end].endswith(s))
            assert len(out) == first_end - longest


# --- engine -----------------------------------------------------------------------------------------

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=40)
MESSAGES = [{"role": "user", "content": "hello there"}]


@pytest.fixture(scope="module")
def engine():
    return tiny_engine()


@pytest.fixture(scope="module")
def baseline(engine):
    """The greedy reply with no stops: its rounds, tokens and the text each token adds."""
    prompt = engine.encode_chat(MESSAGES)
    engine.reset()
    *events, summary = engine.generate(prompt, GREEDY, SpecParams(k=4))
    assert summary.stop_reason == "length" and summary.new_tokens == 40
    tokens = []  # (round index, index in round, round size, token id, text)
    for r, ev in enumerate(events):
        for c in ev.committed:
            tokens.append((r, c.index, len(ev.committed), c.token_id, c.text))
    assert [t[3] for t in tokens] == list(summary.token_ids)
    assert "".join(t[4] for t in tokens) == summary.text
    return prompt, events, summary, tokens


def assert_consistent(engine):
    m = engine.target_pool.manager
    assert m.length(0) == len(engine.ids) - 1
    d = engine.model_drafter
    assert engine.ids[: len(d.cached)] == d.cached
    assert d.pool.manager.length(0) == len(d.cached)
    assert len(d.cached) <= len(engine.ids) - 1


def run(engine, prompt, sampling, spec):
    *events, summary = engine.generate(prompt, sampling, spec)
    assert isinstance(summary, Summary) and all(isinstance(e, RoundEvent) for e in events)
    return events, summary


def char_offsets(tokens):
    """Character offset in the reply where each token's text starts."""
    offs, n = [], 0
    for t in tokens:
        offs.append(n)
        n += len(t[4])
    return offs


def two_char_stop(tokens, text: str, offs: list[int], fits) -> tuple[int, str]:
    """The first token j whose piece and the previous one are single characters that first occur together
    at that point in the reply, and for which fits(prev_token, token) holds: (j, the two characters)."""
    for j in range(1, len(tokens)):
        prev, tok = tokens[j - 1], tokens[j]
        stop = prev[4] + tok[4]
        if len(prev[4]) == len(tok[4]) == 1 and fits(prev, tok) and text.find(stop) == offs[j - 1]:
            return j, stop
    raise AssertionError("the fixture reply has no usable stop string of this kind")


def test_stop_string_inside_an_accepted_run_discards_what_follows(engine, baseline):
    prompt, events, summary, tokens = baseline
    offs = char_offsets(tokens)
    text = summary.text
    # A two-character stop string whose second character is a token in the middle of a round (so the
    # round committed tokens after it), occurring nowhere earlier in the reply.
    j, stop = two_char_stop(tokens, text, offs, lambda prev, tok: prev[0] == tok[0] and 1 <= tok[1] < tok[2] - 1)
    r, i, size = tokens[j][:3]

    engine.reset()
    ev2, s2 = run(engine, prompt, GREEDY.with_(stop=(stop,)), SpecParams(k=4))
    assert s2.stop_reason == "stop"
    assert s2.token_ids == summary.token_ids[: j + 1]  # ends at the token completing the stop string
    assert s2.text == text[: offs[j - 1]]  # ends right before the stop string
    assert stop not in s2.text
    assert "".join(e.text_delta for e in ev2) == s2.text
    last = ev2[-1]
    assert last.stop_reason == "stop" and len(ev2) == r + 1
    assert len(last.committed) == i + 1 < size  # the rest of the round's run was discarded
    assert last.committed[-1].token_id == tokens[j][3]
    assert_consistent(engine)


def test_stop_string_spanning_two_rounds_is_held_back(engine, baseline):
    prompt, events, summary, tokens = baseline
    offs = char_offsets(tokens)
    text = summary.text
    j, stop = two_char_stop(tokens, text, offs, lambda prev, tok: prev[0] == tok[0] - 1)
    r = tokens[j][0]
    engine.reset()
    ev2, s2 = run(engine, prompt, GREEDY.with_(stop=(stop,)), SpecParams(k=4))
    assert s2.stop_reason == "stop"
    assert s2.token_ids == summary.token_ids[: j + 1]
    assert s2.text == text[: offs[j - 1]]
    # The round ending with the stop's first character did not show it yet.
    assert ev2[r - 1].text_delta == events[r - 1].text_delta[:-1]
    assert "".join(e.text_delta for e in ev2) == s2.text
    assert_consistent(engine)


def test_partial_stop_at_the_end_is_flushed(engine, baseline):
    prompt, events, summary, tokens = baseline
    stop = summary.text[-1] + "\n\n"  # starts like the last character; never completes
    assert stop not in summary.text
    engine.reset()
    ev2, s2 = run(engine, prompt, GREEDY.with_(stop=(stop,)), SpecParams(k=4))
    assert s2.stop_reason == "length"
    assert s2.text == summary.text
    assert "".join(e.text_delta for e in ev2) == summary.text  # the held-back last character came out


def test_eos_inside_an_accepted_run(baseline):
    prompt, events, summary, tokens = baseline
    ids = list(summary.token_ids)
    pick = None
    for j, (r, i, size, tid, piece) in enumerate(tokens):
        if 1 <= i < size - 1 and ids.index(tid) == j and tid != 2:
            pick = j, tid
            break
    assert pick is not None
    j, eos = pick
    engine = tiny_engine(eos_ids={eos})
    assert eos in engine.eos_ids
    ev2, s2 = run(engine, prompt, GREEDY, SpecParams(k=4))
    assert s2.stop_reason == "eos"
    assert s2.token_ids == summary.token_ids[: j + 1]
    last = ev2[-1]
    assert last.stop_reason == "eos" and last.committed[-1].token_id == eos
    assert len(last.committed) == tokens[j][1] + 1 < tokens[j][2]
    text_before = summary.text[: char_offsets(tokens)[j]]
    assert s2.text in (text_before, text_before + tokens[j][4])
    assert_consistent(engine)
    # The engine keeps working from there: a second request with the same prompt gives the same reply.
    ev3, s3 = run(engine, prompt, GREEDY, SpecParams(k=4))
    assert s3.token_ids == s2.token_ids


@pytest.mark.parametrize("drafter", ["model", "ngram"])
@pytest.mark.parametrize("max_new", [1, 2, 3, 7, 17, 23])
def test_max_new_tokens_exact_with_large_k(engine, baseline, drafter, max_new):
    prompt, events, summary, tokens = baseline
    engine.reset()
    ev2, s2 = run(engine, prompt, GREEDY.with_(max_new_tokens=max_new), SpecParams(k=16, drafter=drafter))
    assert s2.new_tokens == max_new == len(s2.token_ids)
    assert s2.token_ids == summary.token_ids[:max_new]
    assert s2.stop_reason == "length" and ev2[-1].stop_reason == "length"
    assert all(e.stop_reason is None for e in ev2[:-1])
    done = 0
    for e in ev2:
        assert e.k <= max(0, max_new - done - 1)  # K shrinks so a round can never overshoot
        assert len(e.drafted) <= e.k
        done += len(e.committed)
        assert e.new_tokens == done
    assert_consistent(engine)


def test_caches_consistent_after_stop_and_next_turn_matches_fresh(engine, baseline):
    prompt, events, summary, tokens = baseline
    stop = summary.text[10:12]
    assert summary.text.find(stop) == 10
    engine.reset()
    _, s2 = run(engine, prompt, GREEDY.with_(stop=(stop,)), SpecParams(k=4))
    assert s2.stop_reason == "stop"
    assert_consistent(engine)
    follow = engine.encode_chat(MESSAGES + [{"role": "assistant", "content": s2.text}, {"role": "user", "content": "go"}])
    _, s3 = run(engine, follow, GREEDY.with_(max_new_tokens=20), SpecParams(k=4))
    assert s3.reused_prefix_tokens > 0
    fresh = tiny_engine()
    _, s4 = run(fresh, follow, GREEDY.with_(max_new_tokens=20), SpecParams(enabled=False))
    assert s3.token_ids == s4.token_ids


def test_cancel_with_held_back_text_keeps_stream_and_summary_in_step(engine, baseline):
    """Text held back as a possible stop-string start must end up in the same place in the streamed deltas
    and in Summary.text: the GUI shows the deltas while the chat history stores Summary.text."""
    from engine.runtime.engine import Controls

    prompt, events, summary, tokens = baseline
    shown = events[0].text_delta + events[1].text_delta
    assert shown
    stop = shown[-1] + "\n\n"  # the last character shown after round 2 could start it: it is held back
    sampling = GREEDY.with_(stop=(stop,))
    controls = Controls(sampling, SpecParams(k=4))
    engine.reset()
    deltas = []
    for item in engine.generate(prompt, sampling, SpecParams(k=4), controls):
        if isinstance(item, Summary):
            s = item
            break
        deltas.append(item.text_delta)
        if item.round == 2:
            controls.cancel()
    assert s.stop_reason == "cancelled" and s.rounds == 2
    assert "".join(deltas) == shown[:-1]  # held back while the request ran
    # At the cancel the held-back character is released: into Summary.text, and as text_tail, the part no
    # RoundEvent carried, so a consumer that streamed the deltas can append exactly what it missed.
    assert s.text_tail == shown[-1]
    assert s.text == "".join(deltas) + s.text_tail == shown
