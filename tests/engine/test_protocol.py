"""The messages between the window and the engine process (engine/api/protocol.py): what a malformed or unknown
one gets on either side. The engine answers it with CommandError and serves on; the window logs it and reads on."""
import logging
import pickle
import subprocess
import sys
import time

import pytest

from engine.api.config import SamplingParams, SpecParams
from engine.api.protocol import (
    COMMANDS,
    EVENTS,
    Cancel,
    CommandError,
    EngineStatus,
    Finished,
    Generate,
    Load,
    Loaded,
    QueryStatus,
    RequestSummary,
    Rounds,
    Shutdown,
    Started,
    Step,
    problem,
)
from engine.service.loaders import Factory
from engine.service.process import spawn
from tests.app_fixtures import fake, make_round, make_summary

MESSAGES = [{"role": "user", "content": "hello"}]
LISTER = Factory("tests.app_fixtures:listed_models", {"names": []})


def forged(cls, **values):
    """A message as unpickling makes one: no __init__, so no check; fields left out are missing."""
    msg = object.__new__(cls)
    for name, value in values.items():
        object.__setattr__(msg, name, value)
    return msg


MALFORMED = [
    pytest.param((), "not a message this side reads: ()", id="empty tuple"),
    pytest.param(5, "not a message this side reads: 5", id="int"),
    pytest.param(("cancel",), "not a message this side reads: ('cancel',)", id="old tuple cancel"),
    pytest.param(("generate",), "not a message this side reads: ('generate',)", id="old tuple generate"),
    pytest.param(Started(1), "not a message this side reads: Started(", id="an event sent as a command"),
    pytest.param(forged(Cancel, rid="3"), "Cancel.rid must be int | None, got '3'", id="rid a str"),
    pytest.param(forged(Step, rid=True), "Step.rid must be int, got True", id="rid a bool"),
    pytest.param(forged(Step), "Step.rid is missing", id="field missing"),
    pytest.param(forged(Generate, rid=1, messages=[{"role": 1}], sampling=SamplingParams(), spec=SpecParams(),
                        stepping=False), "Generate.messages must be list[dict[str, str]]", id="messages"),
    pytest.param(forged(Generate, rid=1, messages=MESSAGES, sampling=None, spec=SpecParams(), stepping=False),
                 "Generate.sampling must be SamplingParams, got None", id="sampling None"),
]


# ---- the messages themselves ----------------------------------------------------------------------------------
def samples() -> list:
    """One message of every type."""
    from engine.api import protocol as p
    from engine.api.events import Phase, PhaseEvent, PrefillProgress

    rid, sampling, spec = 1, SamplingParams(), SpecParams()
    phase = PhaseEvent(1, Phase.DRAFTED, "model", 1, (5,), ("a",), (0.5,))
    return [
        p.Load("/models/t", None, "cpu"), p.CancelLoad(), p.Scan(), p.Generate(rid, MESSAGES, sampling, spec, True, 16),
        p.UpdateControls(rid, sampling, spec), p.Cancel(None), p.Reset(), p.QueryStatus(),
        p.Step(rid), p.Continue(rid), p.SetStepping(rid, False), p.Shutdown(),
        p.Started(2), p.LoadProgress("Loading", 1), p.Loaded(p.EngineInfo("t", None, "cpu", "float32")),
        p.LoadFailed("no"), p.LoadCancelled(), p.ModelsListed(["m"]), p.Rounds(rid, [make_round()]),
        p.Prefilling(rid, PrefillProgress("target", 512, 2048, 3)), p.PhaseReached(rid, phase), p.RequestSummary(rid, make_summary([make_round()])), p.Errored(rid, "no"),
        p.Finished(rid), p.EngineStatus(2, 3, False, None, None, 4, 5), p.Fatal("no"), p.CommandError("no"),
    ]


def test_every_message_is_a_frozen_dataclass_that_survives_the_pipe():
    messages = samples()
    assert [type(m) for m in messages] == list(COMMANDS + EVENTS)
    for msg in messages:
        assert type(msg).__dataclass_params__.frozen
        assert pickle.loads(pickle.dumps(msg)) == msg
        assert problem(msg, COMMANDS if type(msg) in COMMANDS else EVENTS) is None


@pytest.mark.parametrize("msg, says", MALFORMED)
def test_a_malformed_message_is_named(msg, says):
    assert says in problem(msg, COMMANDS)


def test_a_sender_cannot_build_a_malformed_message():
    with pytest.raises(TypeError, match="Cancel.rid must be int"):
        Cancel("3")
    with pytest.raises(TypeError, match=r"Rounds.events must be list\["):
        Rounds(1, [1, 2])
    with pytest.raises(TypeError, match="Loaded.info must be EngineInfo"):
        Loaded(("t", None, "cpu", "f32"))


def test_the_protocol_imports_neither_torch_nor_qt():
    code = ("import sys, engine.api.protocol; bad = [m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'PySide6')]; sys.exit(1 if bad else 0)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True).returncode == 0


# ---- the engine process: refuses and serves on --------------------------------------------------------------
class Engine:
    """A spawned engine process, driven straight through its pipe."""

    def __init__(self, loader: Factory) -> None:
        self.process, self.conn = spawn(loader, LISTER)
        assert isinstance(self.next(), Started)

    def next(self, timeout: float = 30.0):
        assert self.conn.poll(timeout), "the engine process said nothing"
        return self.conn.recv()

    def until(self, cls, timeout: float = 10.0) -> list:
        """Every message up to and with the first of type cls."""
        seen, end = [], time.monotonic() + timeout
        while not seen or not isinstance(seen[-1], cls):
            seen.append(self.next(max(0.0, end - time.monotonic())))
        return seen

    def close(self) -> None:
        self.conn.send(Shutdown())
        self.process.join(5)
        assert self.process.exitcode == 0


@pytest.fixture
def engine():
    e = Engine(fake(round_delay=0.05))
    yield e
    e.close()


@pytest.mark.parametrize("msg, says", MALFORMED)
def test_the_engine_answers_a_malformed_command_and_serves_on(engine, msg, says):
    engine.conn.send(msg)
    answer = engine.next()
    assert isinstance(answer, CommandError) and says in answer.problem
    engine.conn.send(QueryStatus())
    assert isinstance(engine.next(), EngineStatus)


def test_bytes_that_do_not_unpickle_are_refused(engine):
    engine.conn.send_bytes(b"not a pickle")
    answer = engine.next()
    assert isinstance(answer, CommandError) and answer.problem.startswith("unreadable message: UnpicklingError")
    engine.conn.send(QueryStatus())
    assert isinstance(engine.next(), EngineStatus)


def test_a_second_generate_with_a_running_id_is_refused_and_the_first_runs_on(engine):
    engine.conn.send(Load(None, None, None))
    engine.until(Loaded)
    first = Generate(7, MESSAGES, SamplingParams(max_new_tokens=12), SpecParams())
    engine.conn.send(first)
    assert isinstance(engine.next(), Rounds)
    engine.conn.send(first)
    seen = engine.until(Finished)
    refusals = [m for m in seen if isinstance(m, CommandError)]
    assert [m.problem for m in refusals] == ["Generate.rid 7 is still running"]
    assert sum(isinstance(m, RequestSummary) for m in seen) == 1 and seen[-1] == Finished(7)
    engine.conn.send(first)  # finished: the id may be used again
    assert isinstance(engine.until(Finished)[-2], RequestSummary)


# ---- the window's side: logs and reads on -------------------------------------------------------------------
def test_the_host_logs_an_unknown_or_malformed_event_and_reads_on(qtbot, make_host, caplog):
    host = make_host()
    req = host.generate(MESSAGES, SamplingParams(), SpecParams())
    heard = []
    req.rounds.connect(heard.append)
    with caplog.at_level(logging.WARNING, logger="app.host"):
        for msg in [(), ("rounds", req.id, []), Cancel(1), forged(Rounds, rid=req.id, events=[1]),
                    forged(Finished, rid="1")]:
            host._message.emit((host.process, msg))  # as the reader thread posts what the pipe brings
        qtbot.waitUntil(lambda: not host.busy, timeout=5000)
    ignored = [r.getMessage() for r in caplog.records if "ignored a message" in r.getMessage()]
    assert len(ignored) == 5 and "Rounds.events must be" in ignored[3]
    assert heard and all(isinstance(ev, type(make_round())) for batch in heard for ev in batch)
    statuses = []
    host.statusReady.connect(statuses.append)
    host.query_status()
    qtbot.waitUntil(lambda: bool(statuses), timeout=5000)
    assert host.running and host.ready


def test_the_host_logs_what_the_engine_refused(qtbot, make_host, caplog):
    host = make_host(load=False)
    with caplog.at_level(logging.WARNING, logger="app.host"):
        host.send(("cancel",))
        qtbot.waitUntil(lambda: any("refused a command" in r.getMessage() for r in caplog.records), timeout=5000)
    assert host.running


def test_the_host_says_when_the_engine_speaks_another_protocol_version(qtbot, make_host, caplog):
    host = make_host(load=False)
    with caplog.at_level(logging.ERROR, logger="app.host"):
        host._message.emit((host.process, Started(host.process.pid, protocol=99)))
        qtbot.waitUntil(lambda: bool(caplog.records), timeout=5000)
    assert "protocol version 99" in caplog.records[0].getMessage()


# ---- hostile commands: the reader survives whatever arrives ----------------------------------------------------
def nested_load_pickle(depth: int) -> bytes:
    """A pickled Load whose target is a list nested `depth` deep (too deep for pickle.dumps to write): the
    placeholder string's opcodes are replaced by `depth` EMPTY_LISTs, each APPENDed into the one below."""
    msg = forged(Load, target="PLACEHOLDER", draft=None, device=None, context=None)
    data = pickle.dumps(msg, protocol=4)
    placeholder = b"\x8c\x0bPLACEHOLDER"
    assert data.count(placeholder) == 1
    return data.replace(placeholder, b"]" * depth + b"a" * (depth - 1))


def test_a_deeply_nested_value_is_described_in_bounded_text():
    msg = pickle.loads(nested_load_pickle(20_000))
    says = problem(msg, COMMANDS)
    assert says.startswith("Load.target must be str | None, got [[[") and len(says) < 200
    assert problem(["x" * 10**6], COMMANDS).endswith("\u2026") or len(problem(["x" * 10**6], COMMANDS)) < 200


@pytest.mark.parametrize("spec, says", [
    ({"k": 0}, "Generate.spec: K must be >= 1, got 0"),
    ({"k_max": 10**9}, "Generate.spec: SpecParams.k_max must be in [1, 64]"),
    ({"drafter": "oracle"}, "Generate.spec: drafter must be one of"),
    ({"stop_below": float("nan")}, "Generate.spec: SpecParams.stop_below must be a finite number"),
])
def test_decoding_settings_built_past_their_checks_are_refused(spec, says):
    forged_spec = forged(SpecParams, **(vars(SpecParams()) | spec))
    msg = forged(Generate, rid=1, messages=MESSAGES, sampling=SamplingParams(), spec=forged_spec, stepping=False)
    assert says in problem(msg, COMMANDS)
    bad_sampling = forged(SamplingParams, **(vars(SamplingParams()) | {"temperature": -1.0}))
    msg = forged(Generate, rid=1, messages=MESSAGES, sampling=bad_sampling, spec=SpecParams(), stepping=False)
    assert "Generate.sampling: temperature must be in [0, 10]" in problem(msg, COMMANDS)


def test_a_load_with_an_impossible_context_is_refused():
    assert "Load.context must be None or a token count" in problem(forged(Load, target=None, draft=None,
                                                                          device=None, context=-5), COMMANDS)


def test_the_engine_survives_a_deeply_nested_command(engine):
    engine.conn.send_bytes(nested_load_pickle(20_000))
    answer = engine.next()
    assert isinstance(answer, CommandError) and answer.problem.startswith("Load.target must be str | None")
    engine.conn.send(QueryStatus())
    assert isinstance(engine.next(), EngineStatus)


def test_the_engine_refuses_k_zero_over_the_pipe_and_serves_on(engine):
    engine.conn.send(Load(None, None, None))
    engine.until(Loaded)
    spec = forged(SpecParams, **(vars(SpecParams()) | {"k": 0}))
    engine.conn.send(forged(Generate, rid=3, messages=MESSAGES, sampling=SamplingParams(max_new_tokens=4),
                            spec=spec, stepping=False))
    answer = engine.next()
    assert isinstance(answer, CommandError) and "K must be >= 1, got 0" in answer.problem
    engine.conn.send(Generate(4, MESSAGES, SamplingParams(max_new_tokens=4), SpecParams()))
    assert engine.until(Finished)[-1] == Finished(4)


def test_a_handler_that_fails_is_refused_and_the_reader_reads_on(monkeypatch):
    from engine.service.command_loop import Service

    class Pipe:
        def __init__(self, commands):
            self.commands, self.sent = list(commands), []

        def recv(self):
            if not self.commands:
                raise EOFError
            return self.commands.pop(0)

        def send(self, msg):
            self.sent.append(msg)

    pipe = Pipe([QueryStatus(), QueryStatus()])
    service = Service(pipe, fake(), LISTER)
    calls = []

    def status_fails_once():
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("no such page")
        return EngineStatus(1, 2, False, None, None, None, None)

    monkeypatch.setattr(service, "status", status_fails_once)
    service.read_commands()  # returns once the pipe closes: the failure did not end it
    assert isinstance(pipe.sent[0], CommandError) and "QueryStatus could not be handled" in pipe.sent[0].problem
    assert isinstance(pipe.sent[1], EngineStatus)


def test_a_protocol_mismatch_is_one_sentence_for_the_window():
    from engine.api.protocol import PROTOCOL_VERSION, version_problem

    assert version_problem(PROTOCOL_VERSION) is None
    says = version_problem(99)
    assert "protocol version 99" in says and says.endswith("reinstall SpecLens.") and "\n" not in says


def test_the_host_shows_a_protocol_mismatch_and_stops_that_engine(qtbot, make_host):
    host = make_host(load=False)
    deaths = []
    host.died.connect(deaths.append)
    host._message.emit((host.process, Started(host.process.pid, protocol=99)))
    qtbot.waitUntil(lambda: bool(deaths), timeout=10000)
    assert "protocol version 99" in deaths[0] and "reinstall SpecLens" in deaths[0]
    assert not host.running
