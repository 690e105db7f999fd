"""One OpenAI-compatible server (llama-server, vLLM, or another), over httpx.

`ServerClient(url, api_key)`: `probe()` says what the server is (`ServerInfo`), `counters()` reads its speculation
counters from /metrics, `chat()` streams one reply as RoundEvents and ends with a Summary.

Every request has connect and read timeouts and an overall deadline (a server that trickles a byte at a time
never trips a read timeout): `probe()` as a whole within probe_s, another GET within request_s, a reply within
reply_s. Everything a server sends is bounded: a GET's body, a stream's line, a reply's tokens (no more than
asked) and its counters. `chat()` reads the stream on a thread of its own and hands lines over through a queue
that it polls every 50 ms, so a cancel or the deadline ends the reply within that, whatever the socket does;
the reader then closes the connection at its next line (the server stops generating when it sees it closed) or
at its read timeout. A reply counts as complete only when the server says so ([DONE] or a finish_reason);
else it ends "cut off", keeping what arrived.

The API key goes only into the Authorization header: it is never part of a message, a repr or the URL shown.
A user:password in the URL becomes Basic auth and is dropped from the URL httpx sees (its request log prints
URLs; engine/remote/urls.py); with an API key as well the client refuses, since one Authorization header cannot
carry both.
"""
from __future__ import annotations

import base64
import json
import queue
import reprlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from engine.api.config import K_LIMIT, SamplingParams
from engine.api.events import RoundEvent, Summary
from engine.remote import metrics, sse
from engine.remote.errors import RemoteError
from engine.remote.rounds import ReplyCut, RoundBuilder
from engine.remote.urls import check_url, credentials, public_url

KEY_ENV = "SPECLENS_API_KEY"  # where the CLI (and the app, when the dialog leaves the key empty) reads a key
POLL_S = 0.05  # how often a streaming reply looks at its cancel flag and its deadline
MAX_BODY = 8 << 20  # a GET's answer (/v1/models, /props, /slots, /metrics): a few KB from a real server
MAX_LINE = 1 << 20  # one line of a stream: a chunk is a few hundred bytes
MAX_QUEUED = 4096  # lines read and not yet handled: the reader waits beyond this
# What a bad reply's parts raise where a check was missed: turned into a RemoteError, never a dead thread
_UNREADABLE = (AttributeError, TypeError, ValueError, KeyError, IndexError, OverflowError, RecursionError)
OFF_PER_REQUEST = {"speculative.n_max": 0, "speculative.n_min": 0}  # llama-server's per-request fields, where honoured


@dataclass(frozen=True)
class ServerInfo:
    """What a server told about itself. `kind`: "llama.cpp", "vllm" or "openai" (any other compatible server)."""

    url: str  # without credentials
    kind: str
    version: str  # a build or version string, "" when the server gives none
    models: tuple[str, ...]
    draft_model: str | None  # llama.cpp: the draft it loaded, when /props names it
    k: int | None  # the server's draft limit (llama.cpp: speculative.n_max), when it says (this build does not)
    speculative: bool | None  # llama.cpp: its slots have a draft (/slots); None: the server does not say
    counters: metrics.SpecCounters | None  # /metrics at probe time; None without speculation counters
    metrics_ok: bool  # /metrics answered
    per_request_spec: bool | None = None  # K / on-off per request honoured (None: not checked)
    notes: tuple[str, ...] = field(default=())  # what the user should know (e.g. "drafts nothing")

    @property
    def model(self) -> str:
        return self.models[0] if self.models else "(unnamed model)"

    @property
    def label(self) -> str:
        """e.g. "llama.cpp b6123 at http://127.0.0.1:8080"."""
        return f"{self.kind}{' ' + self.version if self.version else ''} at {self.url}"


class _Stopped(RemoteError):
    """A request ended by its deadline or a cancel, not by the server's answer."""


class ServerClient:
    def __init__(self, url: str, api_key: str | None = None, *, connect_s: float = 5.0, read_s: float = 60.0,
                 probe_s: float = 30.0, request_s: float = 30.0, reply_s: float = 1800.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        """read_s: the longest the server may stay silent, mid-stream or before its first byte (a long prompt's
        prefill on a slow server needs a generous one). probe_s: all of probe() (connecting); request_s: any
        other GET; reply_s: one streamed reply, end to end."""
        url, creds = credentials(check_url(url))
        if creds is not None and api_key:
            raise RemoteError(f"{public_url(url)}: the URL carries a user name and password and an API key is set "
                              f"too ({KEY_ENV} or the key field); a server reads one Authorization header, so give "
                              "one of them")
        self.url = url  # never with user:password: httpx logs the URLs it requests
        self.public = public_url(self.url)
        if creds is not None:
            token = base64.b64encode(f"{creds[0]}:{creds[1]}".encode()).decode()
            self._headers = {"Authorization": f"Basic {token}"}
        else:
            self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = httpx.Timeout(connect=connect_s, read=read_s, write=connect_s, pool=connect_s)
        self.probe_s, self.request_s, self.reply_s = probe_s, request_s, reply_s
        self._transport = transport
        self._abort = threading.Event()  # set by abort(): a probe or GET under way ends at once
        self.info: ServerInfo | None = None

    def __repr__(self) -> str:  # never the key
        return f"ServerClient({self.public!r})"

    def abort(self) -> None:
        """End a probe() or GET under way on another thread within POLL_S (it raises RemoteError); a later call
        runs again."""
        self._abort.set()

    def _client(self, read_s: float | None = None) -> httpx.Client:
        # verify=True: https is checked against the system's CA bundle (httpx's default, kept explicit)
        timeout = self.timeout if read_s is None else httpx.Timeout(
            connect=min(self.timeout.connect or read_s, read_s), read=min(self.timeout.read or read_s, read_s),
            write=self.timeout.write, pool=self.timeout.pool)
        return httpx.Client(base_url=self.url, headers=self._headers, timeout=timeout, verify=True,
                            transport=self._transport, follow_redirects=False)

    # ---- plain requests ----------------------------------------------------------------------------------------
    def get(self, path: str, required: bool = True, deadline: float | None = None,
            within: float | None = None) -> httpx.Response | None:
        """GET path; an optional one that fails (404, refused) gives None, a required one raises RemoteError.
        The answer is read on a thread of its own, whole within the deadline (time.monotonic(); default
        request_s from now) and at most MAX_BODY bytes."""
        within = within if within is not None else self.request_s
        deadline = deadline if deadline is not None else time.monotonic() + within
        out: queue.Queue[tuple[str, Any]] = queue.Queue()
        threading.Thread(target=self._fetch, args=(path, deadline, within, out), daemon=True,
                         name="speclens-remote-get").start()
        while True:
            if self._abort.is_set():
                self._abort.clear()
                raise _Stopped(f"connecting to {self.public} was cancelled")
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Stopped(f"{self.public}{path} did not finish answering within {within:g} s: is the server "
                               "overloaded, or not the server meant?")
            try:
                what, value = out.get(timeout=min(POLL_S, left))
            except queue.Empty:
                continue
            if what == "error":
                raise RemoteError(value)
            r = value
            break
        if r.status_code >= 400:
            if not required and r.status_code in (401, 403, 404, 405, 501):
                return None
            raise RemoteError(status_sentence(r, self.public, path))
        return r

    def _fetch(self, path: str, deadline: float, within: float, out: queue.Queue) -> None:
        """GET thread: ("ok", a Response read whole) or ("error", a sentence). Its reads wait no longer than the
        deadline leaves, so it ends soon after its caller gave up."""
        try:
            with self._client(max(deadline - time.monotonic(), 0.01)) as c, c.stream("GET", path) as r:
                body = bytearray()
                for piece in r.iter_bytes():
                    body += piece
                    if len(body) > MAX_BODY:
                        out.put(("error", f"{self.public}{path} answered more than {MAX_BODY >> 20} MB: not the "
                                          "server meant?"))
                        return
                    if time.monotonic() > deadline:
                        out.put(("error", f"{self.public}{path} did not finish answering within {within:g} s"))
                        return
                headers = {"content-type": r.headers.get("content-type", "")}
                out.put(("ok", httpx.Response(r.status_code, content=bytes(body), headers=headers,
                                              request=r.request)))
        except httpx.HTTPError as e:
            out.put(("error", describe(e, self.public, path, self.timeout)))
        except Exception as e:  # noqa: BLE001 - the caller must hear of it, whatever broke
            out.put(("error", f"{self.public}{path} failed: {type(e).__name__}: {_reason(e)}"))

    def probe(self) -> ServerInfo:
        """What the server is: /v1/models (required), /props (llama.cpp), /version (vLLM), /metrics. All of it
        within probe_s; whatever the server answers, the only error is a RemoteError."""
        deadline = time.monotonic() + self.probe_s
        self._abort.clear()
        try:
            info = self._probe(deadline)
        except _UNREADABLE as e:  # a shape no check below foresaw
            raise RemoteError(f"{self.public} answered in a way SpecLens cannot read ({type(e).__name__}: "
                              f"{_reason(e)}): is it an OpenAI-compatible server?") from None
        self.info = info
        return info

    def _probe(self, deadline: float) -> ServerInfo:
        def get(path: str, required: bool = False) -> httpx.Response | None:
            return self.get(path, required, deadline, self.probe_s)

        models_json = _json(get("/v1/models", True), "/v1/models")
        data = models_json.get("data") if isinstance(models_json, dict) else None
        if not isinstance(data, list):
            raise RemoteError(f"{self.public}/v1/models did not list models (no 'data' array): is this an "
                              "OpenAI-compatible server?")
        entries = [m for m in data[:1000] if isinstance(m, dict)]
        models = tuple(_text(m.get("id")) for m in entries if isinstance(m.get("id"), str) and m.get("id"))[:100]
        owners = {_text(m.get("owned_by")) for m in entries if isinstance(m.get("owned_by"), str)}
        props = get("/props")
        props_json = _json(props, "/props") if props is not None else None
        kind, version, k, draft, speculative = "openai", "", None, None, None
        if isinstance(props_json, dict) and ("default_generation_settings" in props_json or "llamacpp" in owners):
            kind = "llama.cpp"
            version = _text(props_json.get("build_info"))
            settings = props_json.get("default_generation_settings")
            params = settings.get("params") if isinstance(settings, dict) else None
            n_max = params.get("speculative.n_max") if isinstance(params, dict) else None
            k = n_max if isinstance(n_max, int) and not isinstance(n_max, bool) and 1 <= n_max <= K_LIMIT else None
            draft = _text(props_json.get("model_path_draft")) or None
            speculative = self._slots_draft(get)
        elif "vllm" in owners:
            kind = "vllm"
            ver = _json(get("/version"), "/version")
            version = _text(ver.get("version")) if isinstance(ver, dict) else ""
        counters, metrics_ok = self._metrics(kind, get)
        if kind == "vllm":
            k = vllm_k(counters)
        return ServerInfo(self.public, kind, version, models, draft, k, speculative, counters, metrics_ok,
                          notes=tuple(_notes(kind, speculative, metrics_ok)))

    def _slots_draft(self, get: Any) -> bool | None:
        """llama-server's /slots says per slot whether it has a draft model ("speculative"); it drafts only when
        also started with --spec-type, which nothing but its counters reveals."""
        try:
            r = get("/slots")
            slots = _json(r, "/slots") if r is not None else None
        except _Stopped:  # the deadline or a cancel ends the whole probe
            raise
        except RemoteError:  # /slots is a convenience: a server that refuses it is still attached
            return None
        if isinstance(slots, list) and slots and isinstance(slots[0], dict) and "speculative" in slots[0]:
            return slots[0]["speculative"] is True
        return None

    def _metrics(self, kind: str, get: Any = None) -> tuple[metrics.SpecCounters | None, bool]:
        r = (get or (lambda path: self.get(path, required=False)))("/metrics")
        if r is None:
            return None, False
        return metrics.parse(r.text, kind), True

    def counters(self) -> metrics.SpecCounters | None:
        """The server's speculation counters now (None: no /metrics, or no speculation counters in it)."""
        kind = self.info.kind if self.info else "llama.cpp"
        try:
            return self._metrics(kind)[0]
        except _UNREADABLE as e:
            raise RemoteError(f"{self.public}/metrics answered in a way SpecLens cannot read "
                              f"({type(e).__name__}: {_reason(e)})") from None

    def check_per_request_spec(self) -> bool | None:
        """Whether this llama-server honours the per-request speculative fields, found out by asking and watching
        its counters, never assumed: a short greedy request with "speculative.n_max": 0 must draft nothing while
        the same request without it drafts. True / False, or None when that cannot tell (not a llama-server with
        a draft, or the plain request drafted nothing either). Two short requests; they count in its /metrics."""
        info = self.info
        if info is None or info.kind != "llama.cpp" or info.speculative is False:
            return None
        probe = [{"role": "user", "content": "Count from 1 to 20: 1, 2, 3,"}]
        sampling = SamplingParams(temperature=0.0, max_new_tokens=12, seed=0)
        self._abort.clear()

        def drafted(extra: dict[str, Any] | None) -> int:
            # part of connecting: bounded as probe() is, and ended as it is by abort()
            *_, summary = self.chat(probe, sampling, extra=extra, cancel=self._abort, within=self.probe_s)
            if self._abort.is_set():
                self._abort.clear()
                raise _Stopped(f"connecting to {self.public} was cancelled")
            return summary.drafted

        if drafted(OFF_PER_REQUEST) > 0:
            verdict: bool | None = False
        else:
            verdict = True if drafted(None) > 0 else None
        self.info = replace(info, per_request_spec=verdict)
        return verdict

    # ---- a streamed reply --------------------------------------------------------------------------------------
    def chat(self, messages: list[dict[str, str]], sampling: SamplingParams, *, speculative: bool = True,
             cancel: threading.Event | None = None, extra: dict[str, Any] | None = None,
             within: float | None = None) -> Iterator[list[RoundEvent] | Summary]:
        """Stream one reply: lists of RoundEvents as rounds complete, then its Summary (also after a cancel).
        speculative: whether this server drafts (the rounds' mode). within: the reply's deadline in seconds
        (default reply_s). Raises RemoteError on any failure."""
        info = self.info
        kind = info.kind if info else "openai"
        if kind == "vllm" and speculative and info.k is None:  # K shows in its counters once it has drafted
            k = vllm_k(self.counters())
            self.info = info = replace(info, k=k) if k else info
        body = request_body(messages, sampling, kind, self.info.model if info else None, extra)
        builder = RoundBuilder(sampling.temperature, info.k if info else None, speculative,
                               stop_strings=bool(sampling.stop), max_tokens=sampling.max_new_tokens)
        feed = builder.feed_step if kind == "vllm" else builder.feed
        cancel = cancel or threading.Event()
        lines: queue.Queue[tuple[str, Any]] = queue.Queue(MAX_QUEUED)
        stop_reading = threading.Event()
        reader = threading.Thread(target=self._read_stream, args=(body, lines, stop_reading),
                                  name="speclens-remote-stream", daemon=True)
        reader.start()
        within = within if within is not None else self.reply_s
        deadline = time.monotonic() + within
        complete, cut = False, None
        try:
            try:
                for line in _lines(lines, cancel, deadline, within):
                    payload = sse.parse_line(line)
                    if payload is sse.DONE:
                        complete = True
                        break
                    if payload is not None:
                        try:
                            events = feed(payload)
                        except _UNREADABLE as e:  # a shape no check in the builder foresaw
                            raise RemoteError(f"the server at {self.public} sent a chunk SpecLens cannot read "
                                              f"({type(e).__name__}: {_reason(e)})") from None
                        if events:
                            yield events
            except ReplyCut as e:
                cut = str(e)
            # a finish_reason says the reply is complete, even from a server that sends no [DONE] after it
            if not (complete or cut or cancel.is_set() or builder.finish_reason):
                cut = "cut off: the stream ended before the server said the reply was complete"
            tail, summary = builder.finish(cancelled=cancel.is_set(), cut=cut)
            if tail:
                yield tail
            yield summary
        finally:
            stop_reading.set()  # the reader closes the connection at its next line: the server stops

    def _read_stream(self, body: dict[str, Any], out: queue.Queue, stop: threading.Event) -> None:
        """Reader thread: the response's lines into `out`, then ("end", None), ("cut", reason) or ("error",
        sentence). A line longer than MAX_LINE ends the stream; so does `stop`, checked while `out` is full."""
        path = "/v1/chat/completions"

        def put(item: tuple[str, Any]) -> bool:
            while not stop.is_set():
                try:
                    out.put(item, timeout=POLL_S)
                    return True
                except queue.Full:
                    continue
            return False

        try:
            with self._client() as c, c.stream("POST", path, json=body) as r:
                if r.status_code >= 400:
                    put(("error", status_sentence(_head(r), self.public, path)))
                    return
                for line in bounded_lines(r.iter_bytes(), MAX_LINE):
                    if line is None:
                        put(("cut", f"cut off: the server sent a line longer than {MAX_LINE >> 10} KB"))
                        return
                    if stop.is_set() or not put(("line", line)):
                        return
            put(("end", None))
        except httpx.HTTPError as e:
            put(("error", describe(e, self.public, path, self.timeout, streaming=True)))
        except Exception as e:  # noqa: BLE001 - whatever else breaks the reader must still end the reply
            put(("error", f"reading the reply from {self.public} failed: {type(e).__name__}: {_reason(e)}"))


def bounded_lines(pieces: Iterator[bytes], limit: int) -> Iterator[str | None]:
    """Lines (ends stripped) from a byte stream, each at most `limit` bytes; None once one is longer, after which
    the caller stops. httpx's iter_lines keeps a line whole in memory however long it grows."""
    buf = b""
    for piece in pieces:
        buf += piece
        parts = buf.splitlines(keepends=True)
        buf = parts.pop() if parts and not parts[-1].endswith((b"\n", b"\r")) else b""
        for part in parts:
            if len(part) > limit + 2:
                yield None
                return
            yield part.rstrip(b"\r\n").decode("utf-8", errors="replace")
        if len(buf) > limit:
            yield None
            return
    if buf:
        yield buf.decode("utf-8", errors="replace")


def _head(r: httpx.Response, limit: int = 64 << 10) -> httpx.Response:
    """An error response with at most `limit` bytes of its body read: enough for the server's message."""
    body = bytearray()
    for piece in r.iter_bytes():
        body += piece
        if len(body) >= limit:
            break
    return httpx.Response(r.status_code, content=bytes(body[:limit]),
                          headers={"content-type": r.headers.get("content-type", "")}, request=r.request)


def _lines(lines: queue.Queue, cancel: threading.Event, deadline: float, within: float) -> Iterator[str]:
    """The reader's lines until the stream ends, `cancel` is set or the deadline passes (checked every POLL_S;
    past the deadline: ReplyCut)."""
    while not cancel.is_set():
        if time.monotonic() > deadline:
            raise ReplyCut(f"cut off: the reply took longer than {within:g} s")
        try:
            what, value = lines.get(timeout=POLL_S)
        except queue.Empty:
            continue
        if what == "line":
            yield value
        elif what == "error":
            raise RemoteError(value)
        elif what == "cut":
            raise ReplyCut(value)
        else:
            return


def request_body(messages: list[dict[str, str]], sampling: SamplingParams, kind: str, model: str | None,
                 extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """The chat-completions request for these settings. top_k, the seed and timings_per_token are extensions that
    llama-server and vLLM read (an OpenAI server ignores fields it does not know)."""
    body: dict[str, Any] = {"messages": [dict(m) for m in messages], "stream": True,
                            "max_tokens": sampling.max_new_tokens, "temperature": sampling.temperature,
                            "top_p": sampling.top_p}
    if model:
        body["model"] = model
    if sampling.top_k:
        body["top_k"] = sampling.top_k
    if sampling.seed is not None:
        body["seed"] = sampling.seed
    if sampling.stop:
        body["stop"] = list(sampling.stop)
    if sampling.repetition_penalty != 1.0:
        body["repeat_penalty" if kind == "llama.cpp" else "repetition_penalty"] = sampling.repetition_penalty
    if kind == "llama.cpp":
        body["timings_per_token"] = True
    else:  # vLLM: the usage on every chunk says how many tokens each engine step made
        body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
    body.update(extra or {})
    return body


def describe(e: httpx.HTTPError, where: str, path: str, timeout: httpx.Timeout, streaming: bool = False) -> str:
    """One sentence for a transport failure (never the request's headers)."""
    if isinstance(e, httpx.ConnectTimeout):
        return f"could not connect to {where} within {timeout.connect:g} s (connect timeout): is the address right?"
    if isinstance(e, httpx.ConnectError):
        return f"could not connect to {where}: {_reason(e)} (is the server running, and is the address right?)"
    if isinstance(e, httpx.ReadTimeout):
        what = "stopped sending mid-reply" if streaming else "did not answer"
        return f"the server at {where} {what}: nothing came for {timeout.read:g} s (read timeout)"
    if isinstance(e, (httpx.RemoteProtocolError, httpx.ReadError)):
        return f"the server at {where} closed the connection {'mid-reply' if streaming else 'early'} ({_reason(e)})"
    if isinstance(e, httpx.TimeoutException):
        return f"{where}{path} timed out ({type(e).__name__})"
    return f"{where}{path} failed: {type(e).__name__}: {_reason(e)}"


def status_sentence(r: httpx.Response, where: str, path: str) -> str:
    """One sentence for an HTTP error status, with the server's own message when it gave one."""
    detail = ""
    try:
        j = r.json()
        err = j.get("error", j) if isinstance(j, dict) else j
        detail = _text(err.get("message", err) if isinstance(err, dict) else err, 400)
    except (ValueError, RecursionError):
        detail = r.text[:400].strip()
    hint = {401: " (check the API key)", 403: " (check the API key)", 404: " (is this the server's base URL?)"}
    detail = detail[:200] + ("\u2026" if len(detail) > 200 else "")
    return (f"{where}{path} answered {r.status_code} {r.reason_phrase}{hint.get(r.status_code, '')}"
            f"{': ' + detail if detail else ''}")


def vllm_k(counters: metrics.SpecCounters | None) -> int | None:
    """vLLM drafts num_speculative_tokens every step (its stream does not say how many): draft tokens over drafts
    in its counters, once it has drafted at all. None before that: a step's rejected drafts are then unknown."""
    if counters is None or counters.drafts <= 0:
        return None
    k = round(counters.draft_tokens / counters.drafts)
    return k if 1 <= k <= K_LIMIT else None  # past any real K the counters are not to be believed


def _notes(kind: str, speculative: bool | None, metrics_ok: bool) -> list[str]:
    notes = []
    if kind == "llama.cpp" and speculative is False:
        notes.append("this llama-server has no draft model (-md): every token is a plain target step")
    if kind == "vllm" and not metrics_ok:
        notes.append("/metrics did not answer: vLLM's K (drafts per step) is unknown, so rejected drafts cannot be "
                     "counted")
    if kind == "llama.cpp" and not metrics_ok:
        notes.append("/metrics is off (start llama-server with --metrics): the totals cannot be checked against "
                     "the server's own counters")
    return notes


def _json(r: httpx.Response | None, path: str) -> Any:
    if r is None:
        return None
    try:
        return json.loads(r.content)
    except (ValueError, RecursionError):  # not JSON, or nested past the decoder's stack
        raise RemoteError(f"{path} did not answer JSON: {r.text[:120]!r}") from None


def _text(v: Any, limit: int = 200) -> str:
    """A name or version the server gave, as text of bounded length ("" for none)."""
    if v is None:
        return ""
    text = v if isinstance(v, str) else reprlib.repr(v)
    text = text if len(text) <= limit else text[: limit - 1] + "\u2026"
    # control characters (a terminal's escape sequences among them) never reach a terminal or a label
    return text if text.isprintable() else "".join(c if c.isprintable() else "\ufffd" for c in text)


def _reason(e: Exception) -> str:
    text = str(e) or type(e).__name__
    return text.splitlines()[0][:160]


