"""One OpenAI-compatible server (llama-server, vLLM, or another), over httpx.

`ServerClient(url, api_key)`: `probe()` says what the server is (`ServerInfo`), `counters()` reads its speculation
counters from /metrics, `chat()` streams one reply as RoundEvents and ends with a Summary.

Every request has connect and read timeouts. `chat()` reads the stream on a thread of its own and hands lines
over through a queue that it polls every 50 ms, so a cancel ends the reply within that, whatever the socket does;
the reader then closes the connection at its next line (the server stops generating when it sees it closed) or
at its read timeout. The API key goes only into the Authorization header: it is never part of a message, a
repr or the URL shown (`public_url` drops any credentials in the URL too).
"""
from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from engine.api.config import SamplingParams
from engine.api.events import RoundEvent, Summary
from engine.remote import metrics, sse
from engine.remote.errors import RemoteError
from engine.remote.rounds import RoundBuilder

KEY_ENV = "SPECLENS_API_KEY"  # where the CLI (and the app, when the dialog leaves the key empty) reads a key
POLL_S = 0.05  # how often a streaming reply looks at its cancel flag
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


def public_url(url: str) -> str:
    """The URL without user:password and without a trailing slash: what may be shown, logged or written."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))


def check_url(url: str) -> str:
    """http(s) with a host, else RemoteError; returns it without a trailing slash."""
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 - raises ValueError on a port that is not a number
    except ValueError as e:
        raise RemoteError(f"{url!r} is not a URL ({e})") from None
    if parts.scheme not in ("http", "https"):
        raise RemoteError(f"{public_url(url) or url!r}: only http:// and https:// servers can be attached")
    if not parts.hostname:
        raise RemoteError(f"{url!r} names no host")
    return url.strip().rstrip("/")


class ServerClient:
    def __init__(self, url: str, api_key: str | None = None, *, connect_s: float = 5.0, read_s: float = 60.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        """read_s: the longest the server may stay silent, mid-stream or before its first byte (a long prompt's
        prefill on a slow server needs a generous one)."""
        self.url = check_url(url)
        self.public = public_url(self.url)
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.timeout = httpx.Timeout(connect=connect_s, read=read_s, write=connect_s, pool=connect_s)
        self._transport = transport
        self.info: ServerInfo | None = None

    def __repr__(self) -> str:  # never the key
        return f"ServerClient({self.public!r})"

    def _client(self) -> httpx.Client:
        # verify=True: https is checked against the system's CA bundle (httpx's default, kept explicit)
        return httpx.Client(base_url=self.url, headers=self._headers, timeout=self.timeout, verify=True,
                            transport=self._transport, follow_redirects=False)

    # ---- plain requests ----------------------------------------------------------------------------------------
    def get(self, path: str, required: bool = True) -> httpx.Response | None:
        """GET path; an optional one that fails (404, refused) gives None, a required one raises RemoteError."""
        try:
            with self._client() as c:
                r = c.get(path)
        except httpx.HTTPError as e:
            raise RemoteError(describe(e, self.public, path, self.timeout)) from None
        if r.status_code >= 400:
            if not required and r.status_code in (401, 403, 404, 405, 501):
                return None
            raise RemoteError(status_sentence(r, self.public, path))
        return r

    def probe(self) -> ServerInfo:
        """What the server is: /v1/models (required), /props (llama.cpp), /version (vLLM), /metrics."""
        models_json = _json(self.get("/v1/models"), "/v1/models")
        data = models_json.get("data") if isinstance(models_json, dict) else None
        if not isinstance(data, list):
            raise RemoteError(f"{self.public}/v1/models did not list models (no 'data' array): is this an "
                              "OpenAI-compatible server?")
        models = tuple(str(m.get("id")) for m in data if isinstance(m, dict) and m.get("id"))
        owners = {str(m.get("owned_by", "")) for m in data if isinstance(m, dict)}
        props = self.get("/props", required=False)
        props_json = _json(props, "/props") if props is not None else None
        kind, version, k, draft, speculative = "openai", "", None, None, None
        if isinstance(props_json, dict) and ("default_generation_settings" in props_json or "llamacpp" in owners):
            kind = "llama.cpp"
            version = str(props_json.get("build_info", ""))
            params = (props_json.get("default_generation_settings") or {}).get("params") or {}
            n_max = params.get("speculative.n_max")
            k = int(n_max) if isinstance(n_max, int) and not isinstance(n_max, bool) else None
            draft = props_json.get("model_path_draft") or None
            speculative = self._slots_draft()
        elif "vllm" in owners:
            kind = "vllm"
            ver = self.get("/version", required=False)
            version = str((_json(ver, "/version") or {}).get("version", "")) if ver is not None else ""
        counters, metrics_ok = self._metrics(kind)
        if kind == "vllm":
            k = vllm_k(counters)
        info = ServerInfo(self.public, kind, version, models, draft, k, speculative, counters, metrics_ok,
                          notes=tuple(_notes(kind, speculative, metrics_ok)))
        self.info = info
        return info

    def _slots_draft(self) -> bool | None:
        """llama-server's /slots says per slot whether it has a draft model ("speculative"); it drafts only when
        also started with --spec-type, which nothing but its counters reveals."""
        try:
            r = self.get("/slots", required=False)
            slots = _json(r, "/slots") if r is not None else None
        except RemoteError:  # /slots is a convenience: a server that refuses it is still attached
            return None
        if isinstance(slots, list) and slots and isinstance(slots[0], dict) and "speculative" in slots[0]:
            return bool(slots[0]["speculative"])
        return None

    def _metrics(self, kind: str) -> tuple[metrics.SpecCounters | None, bool]:
        r = self.get("/metrics", required=False)
        if r is None:
            return None, False
        return metrics.parse(r.text, kind), True

    def counters(self) -> metrics.SpecCounters | None:
        """The server's speculation counters now (None: no /metrics, or no speculation counters in it)."""
        kind = self.info.kind if self.info else "llama.cpp"
        return self._metrics(kind)[0]

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

        def drafted(extra: dict[str, Any] | None) -> int:
            *_, summary = self.chat(probe, sampling, extra=extra)
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
             ) -> Iterator[list[RoundEvent] | Summary]:
        """Stream one reply: lists of RoundEvents as rounds complete, then its Summary (also after a cancel).
        speculative: whether this server drafts (the rounds' mode). Raises RemoteError on any failure."""
        info = self.info
        kind = info.kind if info else "openai"
        if kind == "vllm" and speculative and info.k is None:  # K shows in its counters once it has drafted
            k = vllm_k(self.counters())
            self.info = info = replace(info, k=k) if k else info
        body = request_body(messages, sampling, kind, self.info.model if info else None, extra)
        builder = RoundBuilder(sampling.temperature, info.k if info else None, speculative,
                               stop_strings=bool(sampling.stop))
        feed = builder.feed_step if kind == "vllm" else builder.feed
        cancel = cancel or threading.Event()
        lines: queue.Queue[tuple[str, Any]] = queue.Queue()
        stop_reading = threading.Event()
        reader = threading.Thread(target=self._read_stream, args=(body, lines, stop_reading),
                                  name="speclens-remote-stream", daemon=True)
        reader.start()
        try:
            for line in _lines(lines, cancel):
                payload = sse.parse_line(line)
                if payload is sse.DONE:
                    break
                if payload is not None:
                    events = feed(payload)
                    if events:
                        yield events
            tail, summary = builder.finish(cancelled=cancel.is_set())
            if tail:
                yield tail
            yield summary
        finally:
            stop_reading.set()  # the reader closes the connection at its next line: the server stops

    def _read_stream(self, body: dict[str, Any], out: queue.Queue, stop: threading.Event) -> None:
        """Reader thread: the response's lines into `out`, then ("end", None) or ("error", sentence)."""
        path = "/v1/chat/completions"
        try:
            with self._client() as c, c.stream("POST", path, json=body) as r:
                if r.status_code >= 400:
                    r.read()
                    out.put(("error", status_sentence(r, self.public, path)))
                    return
                for line in r.iter_lines():
                    if stop.is_set():
                        return
                    out.put(("line", line))
            out.put(("end", None))
        except httpx.HTTPError as e:
            out.put(("error", describe(e, self.public, path, self.timeout, streaming=True)))
        except Exception as e:  # noqa: BLE001 - whatever else breaks the reader must still end the reply
            out.put(("error", f"reading the reply from {self.public} failed: {type(e).__name__}: {e}"))


def _lines(lines: queue.Queue, cancel: threading.Event) -> Iterator[str]:
    """The reader's lines until the stream ends or `cancel` is set (checked every POLL_S)."""
    while not cancel.is_set():
        try:
            what, value = lines.get(timeout=POLL_S)
        except queue.Empty:
            continue
        if what == "line":
            yield value
        elif what == "error":
            raise RemoteError(value)
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
        detail = str(err.get("message", err) if isinstance(err, dict) else err)
    except ValueError:
        detail = r.text.strip()
    hint = {401: " (check the API key)", 403: " (check the API key)", 404: " (is this the server's base URL?)"}
    detail = detail[:200] + ("\u2026" if len(detail) > 200 else "")
    return (f"{where}{path} answered {r.status_code} {r.reason_phrase}{hint.get(r.status_code, '')}"
            f"{': ' + detail if detail else ''}")


def vllm_k(counters: metrics.SpecCounters | None) -> int | None:
    """vLLM drafts num_speculative_tokens every step (its stream does not say how many): draft tokens over drafts
    in its counters, once it has drafted at all. None before that: a step's rejected drafts are then unknown."""
    if counters is None or counters.drafts <= 0:
        return None
    return round(counters.draft_tokens / counters.drafts)


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
        return r.json()
    except ValueError:
        raise RemoteError(f"{path} did not answer JSON: {r.text[:120]!r}") from None


def _reason(e: Exception) -> str:
    text = str(e) or type(e).__name__
    return text.splitlines()[0][:160]


