"""Shared fixtures for the app tests: a scripted engine and its loaders (they run in the engine process), hand-made
events, hosts and windows, an isolated QSettings.

tests/conftest.py registers this module as a plugin, so its fixtures reach every test; import its helpers by name.
Qt runs headless: QT_QPA_PLATFORM is set to offscreen before anything imports Qt. The engine process imports this
module to build its engine (engine.service.loaders.Factory paths "tests.app_fixtures:..."), so nothing at module level
imports Qt or torch: the scripted engine's process starts in a fraction of a second.
"""
from __future__ import annotations

import json
import os
import pickle
import time
from dataclasses import asdict, dataclass
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import pytest  # noqa: E402

from engine.api.config import SamplingParams, SpecParams  # noqa: E402
from engine.api.events import CommittedToken, DraftToken, Origin, RoundEvent, Summary  # noqa: E402
from engine.api.live import Controls, plain_step_due  # noqa: E402
from engine.runtime.tally import RoundTally  # noqa: E402
from engine.service.loaders import Factory  # noqa: E402

__all__ = [
    "FakeEngine", "SeenRound", "EngineLog", "make_round", "make_summary", "CODE_REPLY", "fake", "tiny", "spy", "spied",
    "_isolated_qsettings", "qt_settings", "engine_log", "make_host", "make_window", "window", "dialogs",
    "wait_idle", "LOAD_TIMEOUT_MS",
]

LOAD_TIMEOUT_MS = 30_000  # a spawned Python plus its imports; the tiny models also build with transformers

CODE_REPLY = ("Here is the function you asked for:\n```python\ndef fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n"
              "        a, b = b, a + b\n    return a\n```\nIt runs in linear time and constant memory, which is "
              "fine for any n that fits in memory.")


@dataclass(frozen=True)
class SeenRound:
    """What the fake engine read from Controls at the start of a round."""

    round: int
    temperature: float
    top_p: float
    k: int
    enabled: bool
    drafter: str
    adaptive: bool


def split_tokens(text: str) -> list[str]:
    """Word-ish pieces that keep their leading space; newlines and backticks stand alone."""
    out: list[str] = []
    cur = ""
    for ch in text:
        if ch in "\n`" or (ch == " " and cur.strip()):
            if cur:
                out.append(cur)
            cur = "" if ch in "\n`" else ch
            if ch in "\n`":
                out.append(ch)
        else:
            cur += ch
    if cur:
        out.append(cur)
    return out


class FakeEngine:
    """A scripted engine with the real generate/encode_chat/reset API.

    The reply is always `script` (so plain and speculative runs agree, as greedy decoding must). Each round
    reads Controls first and records it in `seen`; with speculation on it drafts K tokens of which
    `accept_pattern[round % len]` (capped at K) are right, then commits a correction (or a bonus when all
    pass). `round_delay` sleeps per round; `work_ms` burns one core in numpy (GIL released, like torch).
    `fail_at_round` raises in that round of the first `fail_requests` requests (None: of every one). With `log`,
    what it saw (requests, rounds' controls, resets) is appended to that file as JSON lines (see EngineLog):
    it runs in the engine process, and that is how a test looks inside."""

    def __init__(self, script: str = CODE_REPLY, *, round_delay: float = 0.0, work_ms: float = 0.0,
                 accept_pattern: tuple[int, ...] = (3, 1, 4, 0, 2, 4), fail_at_round: int | None = None,
                 fail_requests: int | None = None, draft_name: str | None = "fake-draft",
                 log: str | None = None) -> None:
        self.tokens = split_tokens(script)
        self.round_delay = round_delay
        self.work_ms = work_ms
        self.accept_pattern = accept_pattern
        self.fail_at_round = fail_at_round
        self.fail_requests = fail_requests
        self.target_name = "fake-target"
        self.draft_name = draft_name
        self.device = "cpu"
        self.dtype_name = "float32"
        self.log = log
        self.seen: list[SeenRound] = []
        self.requests: list[list[dict[str, str]]] = []
        self.resets = 0
        self._cached: list[int] = []
        self._vocab: dict[str, int] = {}

    def _note(self, kind: str, value) -> None:
        if self.log:
            with open(self.log, "a", encoding="utf-8") as f:
                f.write(json.dumps({kind: value}) + "\n")

    def _id(self, piece: str) -> int:
        return self._vocab.setdefault(piece, len(self._vocab) + 10)

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        self.requests.append([dict(m) for m in messages])
        self._note("request", self.requests[-1])
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"
        return [self._id(w) for w in split_tokens(text)]

    def reset(self) -> None:
        self.resets += 1
        self._note("reset", self.resets)
        self._cached = []

    def _burn(self) -> None:
        """Single-threaded numpy work that releases the GIL (as torch kernels do), for work_ms."""
        if self.work_ms > 0:
            import numpy as np

            data = np.random.default_rng(0).random(20000, dtype=np.float32)
            end = time.perf_counter() + self.work_ms / 1000.0
            while time.perf_counter() < end:
                np.sort(data, kind="stable")

    def generate(self, prompt_ids, sampling: SamplingParams, spec: SpecParams, controls=None):
        controls = controls or Controls(sampling, spec)
        self._note("generate", {"seed": sampling.seed, "enabled": spec.enabled})
        failing = self.fail_at_round is not None and (self.fail_requests is None
                                                      or len(self.requests) <= self.fail_requests)
        reused = 0
        while reused < min(len(self._cached), len(prompt_ids) - 1) and self._cached[reused] == prompt_ids[reused]:
            reused += 1
        t0 = time.perf_counter()
        tally = RoundTally(len(prompt_ids), reused)
        i = rounds = 0
        stop = None
        ids: list[int] = []
        while stop is None:
            if controls.cancelled:
                stop = "cancelled"
                break
            s, sp = controls.sampling, controls.spec
            rounds += 1
            if plain_step_due(rounds, controls.plain_every):  # as the engine does
                sp = sp.with_(enabled=False)
            self.seen.append(SeenRound(rounds, s.temperature, s.top_p, sp.k, sp.enabled, sp.drafter, sp.adaptive))
            self._note("seen", asdict(self.seen[-1]))
            if failing and self.fail_at_round == rounds:
                raise RuntimeError("scripted engine failure")
            t_round = time.perf_counter()
            budget = sampling.max_new_tokens - len(ids)
            k = (2 + rounds % 3 if sp.adaptive else sp.k) if sp.enabled else 0
            k = max(0, min(k, budget - 1, len(self.tokens) - i - 1))
            if self.round_delay and k:  # drafting: about 4% of a verify step per drafted token
                time.sleep(self.round_delay * 0.04 * k)
            t_drafted = time.perf_counter()
            if self.round_delay:
                time.sleep(self.round_delay)
            self._burn()
            n_acc = min(self.accept_pattern[rounds % len(self.accept_pattern)], k)
            drafted = []
            for j in range(k):
                right = j < n_acc
                piece = self.tokens[i + j] if right else " nope"
                drafted.append(DraftToken(self._id(piece), piece, 0.5 if right else 0.6, 0.6 if right else 0.1, right))
            committed = [CommittedToken(d.token_id, d.text, Origin.ACCEPTED, j, d.p, d.q)
                         for j, d in enumerate(drafted[:n_acc])]
            final = self.tokens[i + n_acc]
            origin = Origin.PLAIN if k == 0 else (Origin.BONUS if n_acc == k else Origin.CORRECTED)
            committed.append(CommittedToken(self._id(final), final, origin, n_acc, 0.7))
            i += n_acc + 1
            ids += [c.token_id for c in committed]
            if i >= len(self.tokens):
                stop = "eos"
            elif len(ids) >= sampling.max_new_tokens:
                stop = "length"
            t_verified = time.perf_counter()
            timed = bool(self.round_delay or self.work_ms)
            d_ms = (t_drafted - t_round) * 1e3 if timed else 0.4 * k  # untimed: fixed figures
            v_ms = (t_verified - t_drafted) * 1e3 if timed else 5.0
            event = RoundEvent(rounds, "speculative" if k else "plain", sp.drafter if k else None, k, s.temperature,
                               tuple(drafted), tuple(committed), "".join(c.text for c in committed), d_ms, v_ms,
                               time.perf_counter() - t0, len(ids), stop)
            tally.add(event, time.perf_counter() - t0)
            yield event
        self._cached = list(prompt_ids) + ids
        yield tally.summary(time.perf_counter() - t0, stop)


class ModelLoadError(Exception):
    """Named as the engine's, so its message reaches the window as it is."""


def fake(**engine_kw) -> Factory:
    """The engine-process loader for a FakeEngine with these arguments (plus fake_loader's own, below)."""
    return Factory("tests.app_fixtures:fake_loader", engine_kw)


def fake_loader(target, draft, device, progress, cancelled, *, steps: int = 0, gate: str | None = None,
                expect: tuple | None = None, die_loading: str | None = None, **engine_kw) -> FakeEngine:
    """Runs in the engine process. `steps` progress reports; `gate`: wait (up to 10 s) until that file exists,
    then raise if the load was cancelled meanwhile (what provisioning does); `expect`: the (target, draft,
    device) it must be given. A target path, except one that is `expect`ed, does not exist here.
    `die_loading`: the process exits (status 3) when asked to load that target."""
    if die_loading is not None and target == die_loading:
        os._exit(3)
    for i in range(steps):
        progress(f"step {i}", i / max(steps - 1, 1))
    if gate:
        progress("Converting target", 0.25)
        end = time.monotonic() + 10
        while not Path(gate).exists() and time.monotonic() < end:
            time.sleep(0.01)
        if cancelled():
            raise RuntimeError("cancelled")
        progress("Loading weights", 1.0)
    if expect is not None:
        assert (target, draft, device) == tuple(expect), (target, draft, device)
    elif target is not None:
        raise ModelLoadError(f"{target}: no config.json, *.safetensors or .gguf found")
    return FakeEngine(**engine_kw)


def listed_models(names=()) -> list[str]:
    return list(names)


def tiny(**kw) -> Factory:
    return Factory("tests.app_fixtures:tiny_loader", kw)


def tiny_loader(target, draft, device, progress, cancelled, *, max_seq_len: int = 256, no_eos: bool = True,
                round_delay: float = 0.0, draft_name: str | None = None, context: int | None = None):
    """Runs in the engine process: the tiny random pair of tests/tiny.py on one thread (tiny models only pay
    for more). `no_eos`: a random model says EOS early, run to the token limit instead. `round_delay`: sleep
    that long after each round, so that a test can act mid-reply. `draft_name`: what the window is told the draft
    is called (None: it is told of no draft model, though the engine has one)."""
    import torch

    from tests.tiny import tiny_engine

    torch.set_num_threads(1)
    engine = tiny_engine(max_seq_len=context or max_seq_len, draft_name=draft_name)  # context: the app's setting
    if no_eos:
        engine.eos_ids = set()
    if round_delay:
        original = engine.generate

        def generate(*args, **kwargs):
            for ev in original(*args, **kwargs):
                yield ev
                time.sleep(round_delay)

        engine.generate = generate
    return engine


def teardown_marking_loader(target, draft, device, progress, cancelled, *, marker: str):
    """Runs in the engine process: the FakeEngine, with an exit hook that writes `marker` if the interpreter's
    teardown runs (so a test can see whether the process ended without it)."""
    import atexit

    atexit.register(lambda: Path(marker).write_text("the interpreter's teardown ran"))
    return fake_loader(target, draft, device, progress, cancelled)


def spy(inner: Factory, path) -> Factory:
    """`inner`'s engine, with every request's yielded events appended to `path` (read them with `spied`)."""
    return Factory("tests.app_fixtures:spy_loader", {"inner": inner, "path": str(path)})


def spy_loader(target, draft, device, progress, cancelled, *, inner: Factory, path: str):
    engine = inner.resolve()(target, draft, device, progress, cancelled)
    original = engine.generate

    def generate(*args, **kwargs):
        seen = []
        try:
            for ev in original(*args, **kwargs):
                seen.append(ev)
                yield ev
        finally:
            with open(path, "ab") as f:
                pickle.dump(seen, f)

    engine.generate = generate
    return engine


def spied(path) -> list[list[RoundEvent | Summary]]:
    """What a spy(inner, path) engine yielded, per request."""
    out = []
    if Path(path).exists():
        with open(path, "rb") as f:
            while True:
                try:
                    out.append(pickle.load(f))
                except EOFError:
                    return out
    return out


class EngineLog:
    """What a FakeEngine(log=path) in the engine process saw, read back from its file."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def _records(self, kind: str) -> list:
        if not self.path.exists():
            return []
        lines = self.path.read_text(encoding="utf-8").splitlines()
        return [r[kind] for r in map(json.loads, lines) if kind in r]

    @property
    def seen(self) -> list[SeenRound]:
        return [SeenRound(**r) for r in self._records("seen")]

    @property
    def requests(self) -> list[list[dict[str, str]]]:
        return self._records("request")

    @property
    def resets(self) -> int:
        return len(self._records("reset"))

    @property
    def generates(self) -> list[tuple]:
        return [(g["seed"], g["enabled"]) for g in self._records("generate")]


def make_round(round_: int = 1, accepted=("Hello",), rejected=(), final=" world", origin: Origin = Origin.CORRECTED,
               k: int | None = None, mode: str = "speculative", drafter: str | None = "model",
               temperature: float = 0.0, draft_ms: float = 2.0, verify_ms: float = 8.0, elapsed_s: float = 0.01,
               new_tokens: int | None = None, stop_reason: str | None = None) -> RoundEvent:
    """A hand-made round: accepted drafts, then rejected ones, then the final committed token."""
    drafted = [DraftToken(100 + i, t, 0.5, 0.8, True) for i, t in enumerate(accepted)]
    drafted += [DraftToken(200 + i, t, 0.6, 0.15, False) for i, t in enumerate(rejected)]
    committed = [CommittedToken(100 + i, t, Origin.ACCEPTED, i, 0.8, 0.5) for i, t in enumerate(accepted)]
    committed.append(CommittedToken(300, final, origin, len(accepted), 0.42))
    if mode == "plain":
        drafted, drafter, k = [], None, 0
    return RoundEvent(round_, mode, drafter, len(drafted) if k is None else k, temperature, tuple(drafted),
                      tuple(committed), "".join(c.text for c in committed), draft_ms, verify_ms, elapsed_s,
                      new_tokens if new_tokens is not None else len(committed), stop_reason)


def make_summary(events: list[RoundEvent], reused: int = 0, prompt_tokens: int = 12, stop: str = "eos") -> Summary:
    drafted = sum(len(e.drafted) for e in events)
    accepted = sum(e.accepted for e in events)
    new = sum(len(e.committed) for e in events)
    return Summary(new, len(events), len(events) + 1, drafted, accepted, accepted / drafted if drafted else 0.0,
                   new / max(len(events), 1), (), 42.0, 0.05, 0.5, prompt_tokens, reused,
                   sum(e.draft_ms for e in events), sum(e.verify_ms for e in events), stop,
                   "".join(e.text_delta for e in events), tuple(c.token_id for e in events for c in e.committed))


@pytest.fixture(scope="session", autouse=True)
def _isolated_qsettings(tmp_path_factory):
    """No test may touch the user's real settings: default QSettings go to a temp folder."""
    from PySide6.QtCore import QCoreApplication, QSettings

    root = tmp_path_factory.mktemp("qsettings")
    QCoreApplication.setOrganizationName("SpecLensTests")
    QCoreApplication.setApplicationName("SpecLensTests")
    for fmt in (QSettings.Format.IniFormat, QSettings.Format.NativeFormat):
        QSettings.setPath(fmt, QSettings.Scope.UserScope, str(root))
        QSettings.setPath(fmt, QSettings.Scope.SystemScope, str(root))
    QSettings.setDefaultFormat(QSettings.Format.IniFormat)
    yield root


@pytest.fixture
def qt_settings(tmp_path):
    from PySide6.QtCore import QSettings

    return QSettings(str(tmp_path / "speclens.ini"), QSettings.Format.IniFormat)


@pytest.fixture
def engine_log(tmp_path) -> EngineLog:
    return EngineLog(tmp_path / "engine-log.jsonl")


@pytest.fixture
def make_host(qapp, qtbot):
    """Factory: a started EngineHost whose process runs `loader` (default: a FakeEngine), loaded unless
    load=False. Every host's process is shut down after the test."""
    from app.host import EngineHost

    hosts = []

    def make(loader: Factory | None = None, *, load: bool = True, models=(), load_timeout_ms: int = LOAD_TIMEOUT_MS):
        host = EngineHost(loader or fake(), Factory("tests.app_fixtures:listed_models", {"names": list(models)}))
        hosts.append(host)
        host.start()
        if load:
            host.load()
            qtbot.waitUntil(lambda: host.ready or host.loading is None, timeout=load_timeout_ms)
            assert host.ready, "the engine did not load"
        return host

    yield make
    for h in hosts:
        assert h.shutdown(5), "the engine process did not stop in time"


@pytest.fixture
def make_window(qtbot, qt_settings, make_host):
    """Factory: a shown MainWindow over a ChatController over a host (default: make_host(loader))."""
    from app.controller import ChatController
    from app.views.window import MainWindow

    def make(loader: Factory | None = None, *, host=None, load: bool = True, show: bool = True, settings=None,
             **host_kw):
        host = host or make_host(loader, load=load, **host_kw)
        w = MainWindow(ChatController(host), settings if settings is not None else qt_settings)
        qtbot.addWidget(w)
        if show:
            w.show()
            qtbot.waitExposed(w)
        return w

    return make


@pytest.fixture
def window(make_window, engine_log):
    w = make_window(fake(log=str(engine_log.path)))
    yield w
    w.controller.stop()


@pytest.fixture
def dialogs(monkeypatch) -> list[tuple[str, str, str]]:
    """QMessageBox static dialogs record (kind, title, text) instead of blocking."""
    from PySide6.QtWidgets import QMessageBox

    seen: list[tuple[str, str, str]] = []

    def fake_box(kind):
        def show(parent, title, text, *args, **kwargs):
            seen.append((kind, title, text))
            return QMessageBox.StandardButton.Ok

        return show

    for kind in ("critical", "warning", "information", "question"):
        monkeypatch.setattr(QMessageBox, kind, staticmethod(fake_box(kind)))
    return seen


def wait_idle(qtbot, window, timeout: int = 10000) -> None:
    """Until the window's requests have all finished and the window has painted all they brought."""
    qtbot.waitUntil(lambda: not window.controller.busy and not window.frame_timer.isActive(), timeout=timeout)
