"""A local HTTP server for the attach-mode tests: it replays a recording of a real llama-server
(tests/data/remote/*.json, made by scripts/fixtures/record_llama_stream.py) and can misbehave on purpose (an error status,
a malformed chunk, a stall, a connection closed mid-reply). A fake for unit tests only: the live test
(tests/remote/test_live.py) runs real llama-servers."""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

DATA = Path(__file__).parent / "data" / "remote"


def recording(name: str) -> dict[str, Any]:
    return json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))


@dataclass
class Script:
    """What the server does with the next chat request."""

    lines: list[str] = field(default_factory=list)
    status: int = 200
    error_body: str = '{"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}'
    line_delay_s: float = 0.0
    stall_after: int | None = None  # send this many lines, then nothing (the connection stays open)
    close_after: int | None = None  # send this many lines, then drop the connection
    stall_s: float = 30.0
    off_lines: list[str] | None = None  # served instead when the request says "speculative.n_max": 0 (a server
    #                                     that honours per-request speculative fields; the recorded build does not)


class ReplayServer:
    """`with ReplayServer(recording("spec_code")) as srv:` ... `srv.url`. /metrics answers the recording's
    `metrics_before` until a chat request has been served, `metrics_after` from then on."""

    def __init__(self, rec: dict[str, Any] | None = None, *, props: bool = True) -> None:
        rec = rec or {}
        self.models = rec.get("models", {"object": "list", "data": [{"id": "test-model", "owned_by": "llamacpp"}]})
        self.props = rec.get("props") if props else None
        self.slots = rec.get("slots") if props else None
        self.metrics = [rec.get("metrics_before", ""), rec.get("metrics_after", "")]
        self.script = Script(lines=list(rec.get("lines", [])))
        self.requests: list[tuple[str, dict[str, str], bytes]] = []  # (path, headers, body)
        self.served = 0
        self.closed = threading.Event()  # the client closed a stream before its end
        self._stop = threading.Event()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> ReplayServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        srv = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def _send(self, status: int, body: bytes, ctype: str = "application/json") -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                srv.requests.append((self.path, dict(self.headers), b""))
                if self.path == "/v1/models":
                    self._send(200, json.dumps(srv.models).encode())
                elif self.path == "/props" and srv.props is not None:
                    self._send(200, json.dumps(srv.props).encode())
                elif self.path == "/slots" and srv.slots is not None:
                    self._send(200, json.dumps(srv.slots).encode())
                elif self.path == "/metrics" and any(srv.metrics):
                    self._send(200, srv.metrics[min(srv.served, 1)].encode(), "text/plain; version=0.0.4")
                else:
                    self._send(404, b'{"error": {"code": 404, "message": "File Not Found"}}')

            def do_POST(self) -> None:  # noqa: N802
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                srv.requests.append((self.path, dict(self.headers), body))
                s = srv.script
                if s.status != 200:
                    self._send(s.status, s.error_body.encode())
                    return
                if s.off_lines is not None and json.loads(body or b"{}").get("speculative.n_max") == 0:
                    s = Script(lines=s.off_lines)
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                self._stream(s)

            def _chunk(self, data: bytes) -> None:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                self.wfile.flush()

            def _stream(self, s: Script) -> None:
                try:
                    for i, line in enumerate(s.lines):
                        if s.close_after is not None and i == s.close_after:
                            self.close_connection = True
                            return  # no terminating chunk: the client sees the reply cut off
                        if s.stall_after is not None and i == s.stall_after:
                            srv._stop.wait(s.stall_s)
                            return
                        self._chunk((line + "\n").encode())
                        if s.line_delay_s:
                            time.sleep(s.line_delay_s)
                    self.wfile.write(b"0\r\n\r\n")
                    srv.served += 1
                except (BrokenPipeError, ConnectionResetError):
                    srv.closed.set()

        return Handler
