"""Attach mode (engine/remote/, app/remote_host.py) without a real server: round reconstruction on streams
recorded from a real llama-server (tests/data/remote/, made by scripts/fixtures/record_llama_stream.py) replayed by a local
test server, vLLM's documented stream and metrics formats (fixtures written from its documentation and source,
not recorded: vLLM cannot run on these machines), and faults. tests/remote/test_live.py runs real llama-servers."""
from __future__ import annotations

import json
import math
import sys
import threading
import time

import pytest

from engine.api.config import SamplingParams
from engine.api.events import Origin, Summary
from engine.remote import metrics
from engine.remote.client import ServerClient, request_body
from engine.remote.errors import RemoteError
from engine.remote.rounds import RoundBuilder
from engine.remote.urls import check_url, public_url
from tests.remote_server import ReplayServer, recording

GREEDY = SamplingParams(temperature=0.0, max_new_tokens=48, seed=0)
MESSAGES = [{"role": "user", "content": "hi"}]


def chunk(text: str | None, n: int, d: int, a: int, ms: float, reason: str | None = None) -> str:
    """A llama-server chunk as it streams with timings_per_token (the fields the client reads)."""
    body = {"choices": [{"finish_reason": reason, "index": 0, "delta": {} if text is None else {"content": text}}],
            "object": "chat.completion.chunk",
            "timings": {"prompt_n": 12, "prompt_ms": 80.0, "predicted_n": n, "predicted_ms": ms, "draft_n": d,
                        "draft_n_accepted": a}}
    return "data: " + json.dumps(body)


def synthetic() -> list[str]:
    """Token 1 plain (the prompt's pass); round 2 drafts 4, accepts 2 (2 accepted + correction); round 3 drafts 4,
    accepts 4 (4 + bonus); one plain step; the reply ends with a round cut short (drafted 4, accepted 3, the second
    accepted token an EOS, counted in predicted_n with no text)."""
    lines = ['data: {"choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}', "",
             chunk("A", 1, 0, 0, 0.0), ""]
    n, ms = 1, 0.0
    for d, a, texts in ((4, 2, ["b", "c", "D"]), (8, 6, ["e", "f", "g", "h", "I"])):
        ms += 50.0
        for t in texts:
            n += 1
            lines += [chunk(t, n, d, a, ms), ""]
    ms += 20.0
    n += 1
    lines += [chunk("p", n, 8, 6, ms), ""]
    ms += 50.0
    n += 1
    lines += [chunk("z", n, 12, 9, ms), "", chunk(None, n + 1, 12, 9, ms + 1, "stop"), "", "data: [DONE]", ""]
    return lines


def replay(lines: list[str]) -> tuple[list, Summary]:
    b = RoundBuilder(0.0, 4, True)
    events: list = []
    from engine.remote import sse

    for line in lines:
        p = sse.parse_line(line)
        if p is sse.DONE:
            break
        if p is not None:
            events += b.feed(p)
    tail, s = b.finish()
    return events + tail, s


# ---- round reconstruction ----------------------------------------------------------------------------------------
def test_rounds_from_cumulative_counters():
    events, s = replay(synthetic())
    origins = [[c.origin for c in ev.committed] for ev in events]
    assert origins == [
        [Origin.PLAIN],
        [Origin.ACCEPTED, Origin.ACCEPTED, Origin.CORRECTED],
        [Origin.ACCEPTED] * 4 + [Origin.BONUS],
        [Origin.PLAIN],
        [Origin.ACCEPTED, Origin.ACCEPTED],  # cut short by the EOS (the second, text "") among its drafts
    ]
    assert [len(ev.drafted) for ev in events] == [0, 4, 4, 0, 4]
    assert [ev.accepted for ev in events] == [0, 2, 4, 0, 3]
    assert [ev.text_delta for ev in events] == ["A", "bcD", "efghI", "p", "z"]
    assert [ev.verify_ms for ev in events] == [0.0, 50.0, 50.0, 20.0, 51.0]
    assert events[-1].stop_reason == "eos"
    # what the server never sends stays unknown, never made up
    rejected = [d for d in events[1].drafted if not d.accepted]
    assert [d.text for d in rejected] == ["", ""] and all(math.isnan(d.q) and math.isnan(d.p) for d in rejected)
    assert s.drafted == 12 and s.accepted == 9 and s.new_tokens == 12  # the EOS token counts, as the server counts
    assert s.text == "AbcDefghIpz" and s.rounds == 5
    assert s.per_position_acceptance == (1.0, 1.0, 2 / 3, 1 / 3)
    assert s.tokens_per_s == pytest.approx(12 / 171.0 * 1000)
    assert s.prompt_tokens == 12 and s.prefill_s == pytest.approx(0.08)


def test_several_tokens_in_one_chunk_are_split_by_predicted_n():
    """Text held back (an incomplete UTF-8 character) arrives with a later token: predicted_n says how many."""
    lines = [chunk("A", 1, 0, 0, 0.0), chunk("", 1, 4, 2, 40.0), chunk("bc\u00e9", 3, 4, 2, 40.0),
             chunk("D", 4, 4, 2, 40.0), chunk(None, 4, 4, 2, 40.0, "length")]
    events, s = replay(lines)
    assert [len(ev.committed) for ev in events] == [1, 3]
    assert [c.text for c in events[1].committed] == ["", "bc\u00e9", "D"]
    assert [c.origin for c in events[1].committed] == [Origin.ACCEPTED, Origin.ACCEPTED, Origin.CORRECTED]
    assert s.stop_reason == "length" and s.text == "Abc\u00e9D"


def test_counters_that_go_backwards_are_refused():
    b = RoundBuilder(0.0, 4, True)
    b.feed(json.loads(chunk("a", 2, 4, 2, 1.0)[6:]))
    with pytest.raises(RemoteError, match="counters went wrong"):
        b.feed(json.loads(chunk("b", 3, 2, 2, 2.0)[6:]))
    with pytest.raises(RemoteError, match="not a whole number"):
        RoundBuilder(0.0, 4, True).feed({"choices": [], "timings": {"predicted_n": "x"}})


# ---- recorded from a real llama-server ---------------------------------------------------------------------------
def _recorded_events(name: str) -> tuple[dict, list, Summary]:
    rec = recording(name)
    events, s = replay(rec["lines"])
    return rec, events, s


SPEC_RECORDINGS = ["spec_code", "spec_short_eos", "spec_length", "spec_greeting", "spec_yes", "spec_stop_midround"]


@pytest.mark.parametrize("name", SPEC_RECORDINGS)
def test_recorded_stream_matches_the_servers_metrics(name):
    """Every round rebuilt from a real llama-server's stream, checked against that server's own /metrics deltas:
    drafts, drafted and accepted tokens, and accepted per position."""
    rec, events, s = _recorded_events(name)
    before = metrics.parse(rec["metrics_before"], "llama.cpp")
    after = metrics.parse(rec["metrics_after"], "llama.cpp")
    d = after.minus(before)
    assert s.drafted == d.draft_tokens and s.accepted == d.accepted_tokens
    assert sum(1 for ev in events if ev.drafted) == d.drafts
    per_pos = [sum(1 for ev in events if len(ev.drafted) > i and ev.drafted[i].accepted) for i in range(4)]
    assert per_pos == [d.accepted_per_pos.get(i, 0) for i in range(4)]
    text = "".join(json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                   for line in rec["lines"] if line.startswith("data: {") and json.loads(line[6:]).get("choices"))
    assert s.text == text  # nothing lost or doubled
    last = [json.loads(line[6:]) for line in rec["lines"] if line.startswith("data: {")][-1]
    assert s.new_tokens == last["timings"]["predicted_n"]
    for ev in events:  # every round is well formed: accepted drafts, then at most one final token
        finals = [c for c in ev.committed if c.origin != Origin.ACCEPTED]
        assert len(finals) <= 1 and ev.accepted <= len(ev.drafted)
        if finals and ev.drafted:
            assert finals[0].origin == (Origin.BONUS if ev.accepted == len(ev.drafted) else Origin.CORRECTED)


def test_recorded_rounds_have_every_origin_and_plain_steps():
    _, events, _ = _recorded_events("spec_code")
    kinds = {c.origin for ev in events for c in ev.committed}
    assert {Origin.ACCEPTED, Origin.CORRECTED, Origin.PLAIN} <= kinds
    assert events[0].committed[0].origin == Origin.PLAIN  # the token the prompt's pass sampled ...
    assert events[0].verify_ms == 0.0  # ... whose time is the prefill's, not a decode step's


def test_recorded_reply_that_ends_mid_round():
    """A stop string met inside a round: the server ends the reply there, its counters already hold the whole
    round (4 drafted, 4 accepted) and two of its tokens arrive, with no text (the stop string is not sent). The
    round keeps them as accepted drafts with no final token, and the totals still equal /metrics."""
    _, events, s = _recorded_events("spec_stop_midround")
    last = events[-1]
    assert len(last.drafted) == 4 and last.accepted == 4
    assert [c.origin for c in last.committed] == [Origin.ACCEPTED, Origin.ACCEPTED]
    assert last.stop_reason == s.stop_reason == "eos"  # "stop" from the server: replay() gave no stop strings
    assert not s.text.endswith("8,")
    # the token limit never cuts a round: the server drafts fewer near max_tokens (the last round of spec_code)
    _, events, _ = _recorded_events("spec_code")
    assert len(events[-1].drafted) < 4 and events[-1].committed[-1].origin == Origin.BONUS


def test_recorded_server_that_never_drafts():
    """A llama-server with a draft model but no --spec-type: no counters change, every token is a plain step,
    and the bench says so."""
    rec, events, s = _recorded_events("nodraft_code")
    assert s.drafted == 0 and s.new_tokens > 0
    assert all(not ev.drafted and ev.committed[0].origin == Origin.PLAIN for ev in events)
    before, after = (metrics.parse(rec[k], "llama.cpp") for k in ("metrics_before", "metrics_after"))
    assert before is None or after.minus(before).draft_tokens == 0


# ---- the client over HTTP ----------------------------------------------------------------------------------------
def test_client_replays_a_recording_and_reads_the_server():
    with ReplayServer(recording("spec_code")) as srv:
        c = ServerClient(srv.url)
        info = c.probe()
        # this build's /props names no K; /slots says its slots have a draft
        assert info.kind == "llama.cpp" and info.models and info.k is None and info.speculative and info.metrics_ok
        items = list(c.chat(MESSAGES, GREEDY))
        s = items[-1]
        assert isinstance(s, Summary)
        d = c.counters().minus(info.counters)
        assert (s.drafted, s.accepted) == (d.draft_tokens, d.accepted_tokens)
        body = json.loads(next(b for p, _, b in reversed(srv.requests) if p == "/v1/chat/completions"))
        assert body["timings_per_token"] is True and body["stream"] is True and body["seed"] == 0


def test_per_request_speculation_is_found_out_by_asking():
    """The recorded build drafts even when asked not to: False. A server that honours the field: True."""
    with ReplayServer(recording("spec_code")) as srv:
        c = ServerClient(srv.url)
        c.probe()
        assert c.check_per_request_spec() is False and c.info.per_request_spec is False
        asked = json.loads(next(b for p, _, b in srv.requests if p == "/v1/chat/completions"))
        assert asked["speculative.n_max"] == 0
    with ReplayServer(recording("spec_code")) as srv:
        srv.script.off_lines = recording("nodraft_code")["lines"]
        c = ServerClient(srv.url)
        c.probe()
        assert c.check_per_request_spec() is True
    with ReplayServer(recording("nodraft_code")) as srv:  # drafts neither way: it cannot tell
        srv.slots = [{"id": 0, "speculative": True}]
        c = ServerClient(srv.url)
        c.probe()
        assert c.check_per_request_spec() is None


def test_request_body_carries_the_sampling_settings():
    b = request_body(MESSAGES, SamplingParams(temperature=0.7, top_p=0.9, top_k=40, max_new_tokens=99, seed=5,
                                              stop=("END",)), "llama.cpp", "m")
    assert (b["temperature"], b["top_p"], b["top_k"], b["max_tokens"], b["seed"], b["stop"], b["model"]) == \
        (0.7, 0.9, 40, 99, 5, ["END"], "m")
    v = request_body(MESSAGES, GREEDY, "vllm", "m")
    assert v["stream_options"] == {"include_usage": True, "continuous_usage_stats": True}
    assert "timings_per_token" not in v


def test_urls():
    assert check_url("http://127.0.0.1:8080/") == "http://127.0.0.1:8080"
    assert public_url("https://user:secret@example.com:8443/v1/") == "https://example.com:8443/v1"
    for bad in ("ftp://x", "file:///etc/passwd", "127.0.0.1:8080", "http://"):
        with pytest.raises(RemoteError):
            check_url(bad)


# ---- faults ------------------------------------------------------------------------------------------------------
def _chat(srv: ReplayServer, **kw) -> list:
    c = ServerClient(srv.url, **kw)
    c.probe()
    return list(c.chat(MESSAGES, GREEDY))


def test_wrong_url_says_so():
    with ReplayServer() as srv:
        port = srv.url.rsplit(":", 1)[1]
    t = time.monotonic()
    with pytest.raises(RemoteError, match="could not connect to http://127.0.0.1:" + port):
        ServerClient(f"http://127.0.0.1:{port}", connect_s=2).probe()
    assert time.monotonic() - t < 3
    with ReplayServer() as srv:
        with pytest.raises(RemoteError, match="404 Not Found .is this the server's base URL"):
            ServerClient(srv.url + "/nothing-here").probe()


def test_5xx_gives_the_servers_message():
    with ReplayServer(recording("spec_code")) as srv:
        srv.script.status = 503
        with pytest.raises(RemoteError, match="503 Service Unavailable: Loading model"):
            _chat(srv)


def test_malformed_chunk():
    with ReplayServer(recording("spec_code")) as srv:
        srv.script.lines.insert(4, 'data: {"choices": [{"delta": {"content": "x"}')
        with pytest.raises(RemoteError, match="malformed chunk"):
            _chat(srv)


def test_stalled_stream_ends_at_the_read_timeout():
    with ReplayServer(recording("spec_code")) as srv:
        srv.script.stall_after = 6
        t = time.monotonic()
        with pytest.raises(RemoteError, match="stopped sending mid-reply: nothing came for 1 s"):
            _chat(srv, read_s=1.0)
        assert time.monotonic() - t < 4


def test_connection_closed_mid_reply():
    with ReplayServer(recording("spec_code")) as srv:
        srv.script.close_after = 8
        with pytest.raises(RemoteError, match="closed the connection mid-reply"):
            _chat(srv)


def test_cancel_ends_a_stalled_stream_within_a_second():
    with ReplayServer(recording("spec_code")) as srv:
        srv.script.stall_after = 10
        c = ServerClient(srv.url, read_s=30)
        c.probe()
        cancel = threading.Event()
        threading.Timer(0.5, cancel.set).start()
        t = time.monotonic()
        items = list(c.chat(MESSAGES, GREEDY, cancel=cancel))
        assert time.monotonic() - t < 1.5
        assert isinstance(items[-1], Summary) and items[-1].stop_reason == "cancelled"


def test_api_key_is_sent_and_never_shown():
    key = "sk-test-7f3a9c"
    with ReplayServer(recording("spec_code")) as srv:
        c = ServerClient(srv.url, key)
        c.probe()
        list(c.chat(MESSAGES, GREEDY))
        assert all(h.get("Authorization") == f"Bearer {key}" for _, h, _ in srv.requests)
        assert key not in repr(c) and key not in repr(c.info)
        srv.script.status = 401
        with pytest.raises(RemoteError) as e:
            list(c.chat(MESSAGES, GREEDY))
        assert key not in str(e.value) and "check the API key" in str(e.value)


# ---- vLLM: fixtures written from its documented formats ----------------------------------------------------------
VLLM_METRICS = """\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 3.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 12.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 3.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 2.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 1.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="3"} 1.0
"""


def vllm_chunk(text: str, completion_tokens: int, reason: str | None = None) -> str:
    """vLLM's OpenAI server with stream_options.continuous_usage_stats: one chunk per engine step, the usage's
    completion_tokens cumulative (vllm/entrypoints/openai/serving_chat.py, previous_num_tokens)."""
    return "data: " + json.dumps({"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m",
                                  "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": reason}],
                                  "usage": {"prompt_tokens": 9, "completion_tokens": completion_tokens,
                                            "total_tokens": 9 + completion_tokens}})


def test_vllm_metrics_fixture():
    c = metrics.parse(VLLM_METRICS, "vllm")
    assert (c.drafts, c.draft_tokens, c.accepted_tokens) == (3, 12, 7)
    assert c.accepted_per_pos == {0: 3, 1: 2, 2: 1, 3: 1}


def test_vllm_stream_fixture():
    lines = ['data: {"choices":[{"index":0,"delta":{"role":"assistant","content":""}}],'
             '"usage":{"prompt_tokens":9,"completion_tokens":0,"total_tokens":9}}',
             vllm_chunk("A", 1), vllm_chunk("bcdeF", 6), vllm_chunk("gH", 8), vllm_chunk("i", 9, "stop"),
             'data: {"choices":[],"usage":{"prompt_tokens":9,"completion_tokens":9,"total_tokens":18}}',
             "data: [DONE]"]
    models = {"object": "list", "data": [{"id": "m", "object": "model", "owned_by": "vllm"}]}
    with ReplayServer({"models": models, "lines": lines, "metrics_before": VLLM_METRICS,
                       "metrics_after": VLLM_METRICS}, props=False) as srv:
        c = ServerClient(srv.url)
        info = c.probe()
        # vLLM's K (num_speculative_tokens) from its counters: 12 draft tokens over 3 drafts
        assert info.kind == "vllm" and info.counters.draft_tokens == 12 and info.k == 4
        items = list(c.chat(MESSAGES, GREEDY))
    events = [ev for it in items[:-1] for ev in it]
    assert [[o.origin for o in ev.committed] for ev in events] == [
        [Origin.PLAIN], [Origin.ACCEPTED] * 4 + [Origin.BONUS], [Origin.ACCEPTED, Origin.CORRECTED],
        [Origin.CORRECTED]]
    assert items[-1].text == "AbcdeFgHi" and items[-1].new_tokens == 9
    assert (items[-1].drafted, items[-1].accepted) == (12, 5)  # 3 steps at K = 4: 4 + 1 + 0 accepted


def test_vllm_before_its_k_is_known_counts_nothing():
    """No /metrics (or nothing drafted yet): a step's accepted drafts are coloured, nothing is counted as drafted
    or accepted, and its last token is the target's (correction or bonus unknown)."""
    b = RoundBuilder(0.0, None, True)
    events = b.feed_step(json.loads(vllm_chunk("A", 1)[6:])) + b.feed_step(json.loads(vllm_chunk("bcD", 4)[6:]))
    _, s = b.finish()
    assert [c.origin for c in events[1].committed] == [Origin.ACCEPTED, Origin.ACCEPTED, Origin.PLAIN]
    assert events[1].drafted == () and (s.drafted, s.accepted, s.acceptance_rate) == (0, 0, 0.0)


def test_no_torch_no_qt_in_the_client():
    import subprocess

    code = ("import sys, engine.remote.client, engine.remote.bench, engine.tools.bench_server; "
            "print('torch' in sys.modules, 'PySide6' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["False", "False"]
