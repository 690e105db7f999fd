"""Attach mode against servers that lie or misbehave on purpose, all on 127.0.0.1 and bounded in time: what a
server sends is checked where it enters (counters, sizes, lengths, time), a bad answer is one RemoteError
sentence or a reply marked "cut off" that keeps what arrived, and no password or key reaches a message or a log."""
from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from engine.api.config import SamplingParams
from engine.api.events import Summary
from engine.remote import metrics
from engine.remote.client import ServerClient, bounded_lines
from engine.remote.errors import RemoteError
from engine.remote.urls import check_url, public_url

MESSAGES = [{"role": "user", "content": "hi"}]
ASK = SamplingParams(temperature=0.0, max_new_tokens=8, seed=0)
LLAMA_MODELS = {"object": "list", "data": [{"id": "m", "owned_by": "llamacpp"}]}

Route = Callable[[BaseHTTPRequestHandler, threading.Event], None]


class Hostile:
    """`with Hostile({"/v1/models": handler, ...}) as srv:` - each handler writes whatever bytes it likes.
    Paths without a handler answer 404; the server stops (and its handlers with it) on exit."""

    def __init__(self, routes: dict[str, Route]) -> None:
        self.routes, self.stop, self.requests = routes, threading.Event(), []
        srv = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _route(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                srv.requests.append((self.path, dict(self.headers), self.rfile.read(n) if n else b""))
                route = srv.routes.get(self.path)
                try:
                    if route is None:
                        send(self, 404, b'{"error": {"message": "File Not Found"}}')
                    else:
                        route(self, srv.stop)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            do_GET = do_POST = _route

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __enter__(self) -> Hostile:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def send(h: BaseHTTPRequestHandler, status: int, body: bytes, ctype: str = "application/json") -> None:
    h.send_response(status)
    h.send_header("Content-Type", ctype)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def answer(obj: object, ctype: str = "application/json") -> Route:
    body = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return lambda h, stop: send(h, 200, body, ctype)


def stream(lines: list[str], *, chunked: bool = True, delay_s: float = 0.0, forever: str | None = None) -> Route:
    """A text/event-stream of these lines; not chunked: no length and the connection closed after them (a
    reply cut short that no transport error reveals); forever: this line repeated until the server stops."""
    def route(h: BaseHTTPRequestHandler, stop: threading.Event) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        if chunked:
            h.send_header("Transfer-Encoding", "chunked")
        else:
            h.send_header("Connection", "close")
            h.close_connection = True
        h.end_headers()

        def write(data: bytes) -> None:
            h.wfile.write(b"%x\r\n%s\r\n" % (len(data), data) if chunked else data)
            h.wfile.flush()

        for line in lines:
            write((line + "\n").encode())
            if delay_s:
                time.sleep(delay_s)
        while forever is not None and not stop.wait(0.05):
            write((forever + "\n").encode())
        if chunked:
            h.wfile.write(b"0\r\n\r\n")
    return route


def llama_chunk(text: str | None, n: float, d: float = 0, a: float = 0, reason: str | None = None) -> str:
    body = {"choices": [{"finish_reason": reason, "index": 0, "delta": {} if text is None else {"content": text}}],
            "timings": {"prompt_n": 3, "prompt_ms": 5.0, "predicted_n": n, "predicted_ms": 1.0 + float(n) % 7,
                        "draft_n": d, "draft_n_accepted": a}}
    return "data: " + json.dumps(body)


def vllm_chunk(text: str, completion_tokens: float) -> str:
    return "data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}],
                                  "usage": {"prompt_tokens": 3, "completion_tokens": completion_tokens}})


def llama_server(chat: Route, **more: Route) -> dict[str, Route]:
    return {"/v1/models": answer(LLAMA_MODELS), "/props": answer({"default_generation_settings": {"params": {}}}),
            "/v1/chat/completions": chat, **more}


def reply(srv: Hostile, **kw) -> tuple[list, Summary]:
    c = ServerClient(srv.url, **kw)
    c.probe()
    items = list(c.chat(MESSAGES, ASK))
    assert isinstance(items[-1], Summary)
    return [ev for it in items[:-1] for ev in it], items[-1]


# ---- what a server claims ----------------------------------------------------------------------------------
def test_metrics_with_nan_and_inf_are_skipped_not_fatal():
    text = ("llamacpp:spec_decode_num_drafts_total NaN\nllamacpp:spec_decode_num_draft_tokens_total +Inf\n"
            "llamacpp:spec_decode_num_accepted_tokens_total 1e300\nllamacpp:spec_decode_num_accepted_tokens_total 5\n"
            'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="99999999999"} 3\n'
            'llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} -1\n')
    c = metrics.parse(text, "llama.cpp")
    assert (c.drafts, c.draft_tokens, c.accepted_tokens, c.accepted_per_pos) == (0, 0, 5, {})
    with Hostile(llama_server(stream([]), **{"/metrics": answer(text.encode(), "text/plain")})) as srv:
        info = ServerClient(srv.url).probe()
    assert info.counters.accepted_tokens == 5 and info.metrics_ok


@pytest.mark.parametrize("props", [
    {"default_generation_settings": [1, 2]},
    {"default_generation_settings": {"params": [1]}},
    {"default_generation_settings": {"params": {"speculative.n_max": 10**30}}, "build_info": ["x"] * 10**4},
    {"default_generation_settings": {}, "model_path_draft": {"a": 1}},
])
def test_props_of_the_wrong_shape_still_attach(props):
    with Hostile(llama_server(stream([]), **{"/props": answer(props)})) as srv:
        info = ServerClient(srv.url).probe()
    assert info.kind == "llama.cpp" and info.k is None and len(info.version) <= 200


@pytest.mark.parametrize("models", [b"[" * 100_000, b'{"data": {"id": 1}}', b'{"data": [{"id": ["x"]}]}'])
def test_models_of_the_wrong_shape_are_one_sentence(models):
    with Hostile({"/v1/models": answer(models)}) as srv:
        try:
            info = ServerClient(srv.url).probe()
        except RemoteError as e:
            assert "\n" not in str(e)
        else:
            assert info.models == ()


def test_a_nan_draft_count_is_a_sentence():
    with Hostile(llama_server(stream([llama_chunk("a", 1), llama_chunk("b", 2, math.nan, 0)]))) as srv:
        with pytest.raises(RemoteError, match="draft_n = nan, not a whole number"):
            reply(srv)


def test_a_huge_draft_count_is_refused_before_anything_is_sized_by_it():
    with Hostile(llama_server(stream([llama_chunk("a", 1), llama_chunk("b", 2, 1e30, 1)]))) as srv:
        with pytest.raises(RemoteError, match="draft_n = 1e.30, not a whole number"):
            reply(srv)
    with Hostile(llama_server(stream([llama_chunk("a", 1), llama_chunk("b", 2, 10**6, 1)]))) as srv:
        with pytest.raises(RemoteError, match="more than K = 64 per round"):
            reply(srv)


def test_more_tokens_than_asked_are_cut_off_keeping_what_came():
    lines = [llama_chunk("a", 1), llama_chunk("b", 2), llama_chunk("c", 10**12), llama_chunk(None, 10**12, 0, 0, "stop")]
    with Hostile(llama_server(stream(lines))) as srv:
        events, s = reply(srv)
    assert s.stop_reason == "cut off: the server sent more than the 8 tokens asked for"
    assert s.text == "ab" and s.new_tokens == 2


def test_vllm_claiming_a_hundred_million_tokens_is_cut_off():
    models = {"object": "list", "data": [{"id": "m", "owned_by": "vllm"}]}
    lines = [vllm_chunk("A", 1), vllm_chunk("B", 10**8), "data: [DONE]"]
    with Hostile({"/v1/models": answer(models), "/v1/chat/completions": stream(lines)}) as srv:
        _, s = reply(srv)
    assert s.stop_reason.startswith("cut off: the server sent more than the 8") and s.text == "A"


def test_a_server_that_ignores_max_tokens_is_stopped_at_them():
    lines = [llama_chunk(chr(97 + i % 26), i + 1) for i in range(200)]
    with Hostile(llama_server(stream(lines, delay_s=0.001))) as srv:
        _, s = reply(srv)
    assert s.new_tokens == 8 and s.text == "abcdefgh" and s.stop_reason.startswith("cut off")


def test_text_without_counts_is_bounded():
    # an OpenAI server sends no counters: the text itself is bounded by what 8 tokens could hold
    big = "data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": "x" * 4000}}]})
    with Hostile(llama_server(stream([], forever=big))) as srv:
        _, s = reply(srv, reply_s=20)
    assert s.stop_reason.startswith("cut off: the server sent more text than 8 tokens")
    assert len(s.text) <= 4096 + 1024 * 8


# ---- time ----------------------------------------------------------------------------------------------------
def test_keep_alive_comments_forever_end_at_the_reply_deadline():
    with Hostile(llama_server(stream([llama_chunk("a", 1)], forever=": keep-alive"))) as srv:
        t = time.monotonic()
        _, s = reply(srv, reply_s=1.0)
    assert time.monotonic() - t < 4
    assert s.stop_reason == "cut off: the reply took longer than 1 s" and s.text == "a"


def test_models_trickled_a_byte_at_a_time_end_at_the_connect_deadline():
    def trickle(h: BaseHTTPRequestHandler, stop: threading.Event) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", "1000")
        h.end_headers()
        while not stop.wait(0.2):
            h.wfile.write(b" ")
            h.wfile.flush()

    with Hostile({"/v1/models": trickle}) as srv:
        t = time.monotonic()
        with pytest.raises(RemoteError, match=r"/v1/models did not finish answering within 1 s"):
            ServerClient(srv.url, probe_s=1.0).probe()
        assert time.monotonic() - t < 2.5


def test_abort_ends_a_probe_under_way():
    def silent(h: BaseHTTPRequestHandler, stop: threading.Event) -> None:
        stop.wait(10)

    with Hostile({"/v1/models": silent}) as srv:
        c = ServerClient(srv.url)
        threading.Timer(0.3, c.abort).start()
        t = time.monotonic()
        with pytest.raises(RemoteError, match="was cancelled"):
            c.probe()
        assert time.monotonic() - t < 1.5


# ---- replies cut short -----------------------------------------------------------------------------------------
def test_a_connection_closed_without_done_is_cut_off_keeping_what_came():
    lines = [llama_chunk("a", 1), "", llama_chunk("b", 2), ""]
    with Hostile(llama_server(stream(lines, chunked=False))) as srv:
        _, s = reply(srv)
    assert s.stop_reason.startswith("cut off: the stream ended before") and s.text == "ab"


def test_a_complete_reply_is_not_cut_off():
    lines = [llama_chunk("a", 1), llama_chunk(None, 1, reason="stop"), "data: [DONE]"]
    with Hostile(llama_server(stream(lines, chunked=False))) as srv:
        _, s = reply(srv)
    assert s.stop_reason == "eos" and s.text == "a"


def test_a_plain_json_body_instead_of_a_stream_is_cut_off():
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "hello"}, "finish_reason": "stop"}]}
    with Hostile(llama_server(answer(body))) as srv:
        _, s = reply(srv)
    assert s.stop_reason.startswith("cut off") and s.new_tokens == 0


def test_a_line_without_end_is_cut_off_at_the_line_bound(monkeypatch):
    from engine.remote import client

    monkeypatch.setattr(client, "MAX_LINE", 64 << 10)

    def endless(h: BaseHTTPRequestHandler, stop: threading.Event) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.send_header("Connection", "close")
        h.end_headers()
        h.wfile.write((llama_chunk("a", 1) + "\n").encode())
        for _ in range(64):  # 4 MB with no newline
            if stop.is_set():
                return
            h.wfile.write(b"x" * (64 << 10))

    with Hostile(llama_server(endless)) as srv:
        _, s = reply(srv, reply_s=20)
    assert s.stop_reason == "cut off: the server sent a line longer than 64 KB"
    assert s.text == "a"


def test_bounded_lines():
    assert list(bounded_lines(iter([b"ab\r\ncd", b"\n\nef"]), 10)) == ["ab", "cd", "", "ef"]
    assert list(bounded_lines(iter([b"x" * 20]), 10)) == [None]
    assert list(bounded_lines(iter([b"ok\n", b"y" * 30 + b"\n"]), 10)) == ["ok", None]


# ---- secrets ---------------------------------------------------------------------------------------------------
def test_a_password_in_the_url_is_never_logged_and_goes_as_basic_auth(caplog):
    with Hostile(llama_server(stream([llama_chunk("a", 1, reason="stop"), "data: [DONE]"]))) as srv:
        url = srv.url.replace("http://", "http://user:S3CRET-PW@")
        with caplog.at_level(logging.DEBUG):
            c = ServerClient(url)
            c.probe()
            list(c.chat(MESSAGES, ASK))
        assert caplog.records and "S3CRET-PW" not in caplog.text
        assert "S3CRET-PW" not in repr(c) and "S3CRET-PW" not in c.url and "S3CRET-PW" not in c.info.url
        assert all(h.get("Authorization", "").startswith("Basic ") for _, h, _ in srv.requests)


@pytest.mark.parametrize("bad", ["http://user:S3CRET-PW@host:port", "ftp://user:S3CRET-PW@host/",
                                 "http://user:S3CRET-PW@", "user:S3CRET-PW@host:8080"])
def test_a_malformed_url_is_never_echoed_with_its_password(bad):
    with pytest.raises(RemoteError) as e:
        check_url(bad)
    assert "S3CRET-PW" not in str(e.value)
    assert "S3CRET-PW" not in public_url(bad)  # never raises, whatever it is given


def test_a_password_and_an_api_key_together_are_refused_with_a_sentence():
    with pytest.raises(RemoteError, match="carries a user name and password and an API key is set too") as e:
        ServerClient("http://user:S3CRET-PW@127.0.0.1:9", "sk-KEY-123")
    assert "S3CRET-PW" not in str(e.value) and "sk-KEY-123" not in str(e.value)


# ---- speclens-bench --server -------------------------------------------------------------------------------------
def test_bench_on_a_hostile_server_says_one_sentence(tmp_path, capsys):
    from engine.tools.bench import main

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "messages": MESSAGES}) + "\n", encoding="utf-8")
    routes = llama_server(stream([llama_chunk("a", 1), llama_chunk("b", 2, math.inf, 0)]),
                          **{"/props": answer({"default_generation_settings": ["x"]}),
                             "/metrics": answer(b"llamacpp:spec_decode_num_drafts_total +Inf\n", "text/plain")})
    with Hostile(routes) as srv:
        with pytest.raises(SystemExit) as e:
            main(["--server", srv.url, "--prompts", str(prompts), "--modes", "draft", "--max-new-tokens", "8"])
    assert str(e.value).startswith("speclens-bench: the server sent draft_n = inf")
    assert "Traceback" not in capsys.readouterr().err


def test_asking_about_per_request_speculation_is_bounded_as_connecting_is():
    routes = llama_server(stream([], forever=": keep-alive"), **{"/slots": answer([{"id": 0, "speculative": True}])})
    with Hostile(routes) as srv:
        c = ServerClient(srv.url, probe_s=1.0)
        assert c.probe().speculative is True
        t = time.monotonic()
        assert c.check_per_request_spec() is None  # two replies, each cut off at the connect deadline
        assert time.monotonic() - t < 4
        threading.Timer(0.3, c.abort).start()
        c.probe_s = 30.0
        t = time.monotonic()
        with pytest.raises(RemoteError, match="was cancelled"):
            c.check_per_request_spec()
        assert time.monotonic() - t < 2
