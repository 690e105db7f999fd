"""The seams between the app and the engine: one declared Host interface that both hosts implement with the
same typed messages, an attached server's rounds batched by the engine's one RoundBatcher, and views that
neither build a backend nor call into a private method."""
from __future__ import annotations

import inspect
import re
from pathlib import Path

from app.host import EngineHost
from app.host_protocol import Host
from app.remote_host import RemoteHost
from engine.api.config import SamplingParams, SpecParams
from engine.api.events import Summary
from engine.api.protocol import Rounds
from engine.remote.client import ServerInfo
from engine.service import streaming
from tests.app_fixtures import make_round, make_summary

ROOT = Path(__file__).resolve().parents[2]
GREEDY, SPEC = SamplingParams(), SpecParams()


def _members(cls: type) -> dict[str, object]:
    return {name: value for name, value in vars(cls).items()
            if not name.startswith("_") and (callable(value) or isinstance(value, property))}


def test_both_hosts_implement_the_one_host_interface(qapp):
    local, remote = EngineHost(), RemoteHost("http://127.0.0.1:9")  # neither starts nor connects anything
    try:
        for host in (local, remote):
            assert isinstance(host, Host)
            for name, member in _members(Host).items():
                mine = inspect.getattr_static(host, name)
                assert isinstance(mine, property) == isinstance(member, property), (type(host).__name__, name)
                if callable(member) and name not in ("setParent", "deleteLater"):
                    wanted = [p for p in inspect.signature(member).parameters if p != "self"]
                    got = inspect.signature(getattr(host, name)).parameters
                    takes_any = any(p.kind is p.VAR_POSITIONAL for p in got.values())
                    assert takes_any or list(got)[:len(wanted)] == wanted, (type(host).__name__, name, list(got))
    finally:
        local.deleteLater()
        remote.deleteLater()


class _ScriptedClient:
    """Stands in for a ServerClient: two reads of rounds, then the Summary, as ServerClient.chat yields them."""

    public = "http://scripted"

    def __init__(self, reads, summary) -> None:
        self.reads, self.summary = reads, summary

    def chat(self, messages, sampling, *, speculative, cancel, extra):
        yield from self.reads
        yield self.summary

    def abort(self) -> None:  # ServerClient's: nothing of this one runs on its own
        pass


def test_an_attached_servers_rounds_reach_the_handle_as_the_engines_do(qapp, qtbot, monkeypatch):
    """Typed messages (Rounds, RequestSummary, Finished), the rounds through the engine's own batcher."""
    events = [make_round(i) for i in range(1, 6)]
    summary = make_summary(events)
    batched: list[Rounds] = []
    original = streaming.RoundBatcher.flush

    def flush(self) -> None:
        batched.extend([Rounds(self.rid, list(self.waiting))] if self.waiting else [])
        original(self)

    monkeypatch.setattr(streaming.RoundBatcher, "flush", flush)
    remote = RemoteHost("http://127.0.0.1:9")
    remote.client = _ScriptedClient([events[:2], events[2:]], summary)
    got: list[tuple[str, object]] = []
    handle = remote.generate([{"role": "user", "content": "hi"}], GREEDY, SPEC)
    handle.rounds.connect(lambda evs: got.append(("rounds", list(evs))))
    handle.summary.connect(lambda s: got.append(("summary", s)))
    handle.errored.connect(lambda m: got.append(("errored", m)))
    with qtbot.waitSignal(handle.finished, timeout=5000):
        pass
    assert [kind for kind, _ in got][-1] == "summary" and not any(kind == "errored" for kind, _ in got)
    assert [ev for kind, evs in got if kind == "rounds" for ev in evs] == events
    assert isinstance(got[-1][1], Summary) and got[-1][1] == summary
    assert batched and [ev for r in batched for ev in r.events] == events  # all of them through RoundBatcher
    assert not remote.pending and remote.shutdown(2.0)
    remote.deleteLater()


def test_connecting_loads_the_servers_info(qapp, qtbot):
    """A server's host "loads" by connecting (Host.load): its probe's answer arrives as loaded(EngineInfo)."""
    server = ServerInfo("http://127.0.0.1:9", "llama.cpp", "b1", ("m.gguf",), None, 4, True, None, True)

    class Client:
        public, info = server.url, server

        def probe(self):
            return server

        def check_per_request_spec(self):
            return None

    remote = RemoteHost("http://127.0.0.1:9")
    remote.client = Client()
    with qtbot.waitSignal(remote.loaded, timeout=5000) as loaded:
        remote.load()
    assert remote.server is server and loaded.args[0].device == server.label and remote.ready
    assert remote.loading is None
    remote.deleteLater()


def test_views_and_dialogs_reach_no_backend_and_no_private_member():
    sources = {p: p.read_text(encoding="utf-8") for d in ("app/views", "app/dialogs") for p in (ROOT / d).rglob("*.py")}
    backend = [str(p) for p, text in sources.items() if re.search(r"^\s*(from|import) engine\.remote", text, re.M)]
    assert not backend
    # a private member of the controller, or of a panel the window holds, reached from outside it
    private = re.compile(r"\b(controller|controls|ctl|window|w)\._[a-z]\w*")
    reached = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p, text in sources.items() for m in private.finditer(text)]
    assert not reached, reached


def test_the_controller_builds_the_servers_host_and_refuses_a_url_that_cannot_be_one(qapp, qtbot):
    from app.controller import ChatController

    controller = ChatController(EngineHost())  # no engine process: attach mode needs none
    with qtbot.waitSignal(controller.attachFailed, timeout=1000) as failed:
        assert controller.attach("ftp://127.0.0.1:9") is False
    assert "http" in failed.args[0] and controller.remote is None and controller.connecting is None
    assert controller.attach("http://127.0.0.1:9")  # built and connecting: nothing listens there
    assert isinstance(controller.connecting, Host) and controller.remote is None
    with qtbot.waitSignal(controller.attachFailed, timeout=10000):
        pass
    assert controller.connecting is None and controller.remote is None and controller.attachment is None
    controller.shutdown()
    controller.deleteLater()
