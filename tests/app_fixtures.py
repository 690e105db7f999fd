"""Shared fixtures for the app tests: a scripted fake engine, hand-made events, an isolated QSettings.

Import with `from tests.app_fixtures import *` (pytest finds the fixtures in the importing module).
Qt runs headless: QT_QPA_PLATFORM is set to offscreen before anything imports Qt.
"""
from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

import threading  # noqa: E402
import time  # noqa: E402
from dataclasses import dataclass  # noqa: E402

import pytest  # noqa: E402

import app  # noqa: E402,F401  (applies app.compat before Qt does much work)
from PySide6.QtCore import QCoreApplication, QSettings  # noqa: E402
from PySide6.QtWidgets import QMessageBox  # noqa: E402

from engine.config import SamplingParams, SpecParams  # noqa: E402
from engine.events import CommittedToken, DraftToken, Origin, RoundEvent, Summary  # noqa: E402

__all__ = [
    "FakeControls", "FakeEngine", "SeenRound", "SignalLog", "make_round", "make_summary", "CODE_REPLY",
    "_isolated_qsettings", "qt_settings", "fake_engine", "make_host", "window", "dialogs", "wait_idle",
]

CODE_REPLY = ("Here is the function you asked for:\n```python\ndef fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n"
              "        a, b = b, a + b\n    return a\n```\nIt runs in linear time and constant memory, which is "
              "fine for any n that fits in memory.")


class FakeControls:
    """Same surface as engine.engine.Controls."""

    def __init__(self, sampling: SamplingParams, spec: SpecParams) -> None:
        self.sampling = sampling
        self.spec = spec
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


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
    pass). `round_delay` sleeps per round; `work_ms` burns one core in numpy (GIL released, like torch)."""

    def __init__(self, script: str = CODE_REPLY, *, round_delay: float = 0.0, work_ms: float = 0.0,
                 accept_pattern: tuple[int, ...] = (3, 1, 4, 0, 2, 4), fail_at_round: int | None = None,
                 draft_name: str | None = "fake-draft") -> None:
        self.tokens = split_tokens(script)
        self.round_delay = round_delay
        self.work_ms = work_ms
        self.accept_pattern = accept_pattern
        self.fail_at_round = fail_at_round
        self.target_name = "fake-target"
        self.draft_name = draft_name
        self.device = "cpu"
        self.dtype_name = "float32"
        self.seen: list[SeenRound] = []
        self.requests: list[list[dict[str, str]]] = []
        self.resets = 0
        self.started = threading.Event()
        self._cached: list[int] = []
        self._vocab: dict[str, int] = {}

    def _id(self, piece: str) -> int:
        return self._vocab.setdefault(piece, len(self._vocab) + 10)

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        self.requests.append([dict(m) for m in messages])
        text = "".join(f"<{m['role']}>{m['content']}" for m in messages) + "<assistant>"
        return [self._id(w) for w in split_tokens(text)]

    def reset(self) -> None:
        self.resets += 1
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
        controls = controls or FakeControls(sampling, spec)
        self.started.set()
        reused = 0
        while reused < min(len(self._cached), len(prompt_ids) - 1) and self._cached[reused] == prompt_ids[reused]:
            reused += 1
        t0 = time.perf_counter()
        i = rounds = drafted_total = accepted_total = 0
        pos_d: list[int] = []
        pos_a: list[int] = []
        draft_ms_total = verify_ms_total = 0.0
        ttft = None
        stop = None
        ids: list[int] = []
        text: list[str] = []
        while stop is None:
            if controls.cancelled:
                stop = "cancelled"
                break
            s, sp = controls.sampling, controls.spec
            rounds += 1
            self.seen.append(SeenRound(rounds, s.temperature, s.top_p, sp.k, sp.enabled, sp.drafter, sp.adaptive))
            if self.fail_at_round == rounds:
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
            for j, d in enumerate(drafted):
                if j >= len(pos_d):
                    pos_d.append(0)
                    pos_a.append(0)
                pos_d[j] += 1
                pos_a[j] += d.accepted
            drafted_total += k
            accepted_total += n_acc
            draft_ms_total += d_ms
            verify_ms_total += v_ms
            ttft = ttft if ttft is not None else time.perf_counter() - t0
            delta = "".join(c.text for c in committed)
            text.append(delta)
            yield RoundEvent(rounds, "speculative" if k else "plain", sp.drafter if k else None, k, s.temperature,
                             tuple(drafted), tuple(committed), delta, d_ms, v_ms, time.perf_counter() - t0,
                             len(ids), stop)
        self._cached = list(prompt_ids) + ids
        total = time.perf_counter() - t0
        yield Summary(
            new_tokens=len(ids), rounds=rounds, target_forwards=rounds + 1, drafted=drafted_total,
            accepted=accepted_total, acceptance_rate=accepted_total / drafted_total if drafted_total else 0.0,
            mean_tokens_per_round=len(ids) / rounds if rounds else 0.0,
            per_position_acceptance=tuple(a / d for a, d in zip(pos_a, pos_d)),
            tokens_per_s=len(ids) / total if total > 0 else 0.0, ttft_s=ttft or total, total_s=total,
            prompt_tokens=len(prompt_ids), reused_prefix_tokens=reused, draft_ms=draft_ms_total,
            verify_ms=verify_ms_total, stop_reason=stop, text="".join(text), token_ids=tuple(ids),
        )


class SignalLog:
    """Records every emission of a signal, from whichever thread emits it.

    For the worker's signals use this with qtbot.waitUntil, not qtbot.waitSignal: a signal emitted in the
    worker thread calls waitSignal's (context-free) slot in that thread, which races the wait."""

    def __init__(self, signal) -> None:
        self.calls: list[tuple] = []
        signal.connect(lambda *args: self.calls.append(args))

    def wait(self, qtbot, count: int = 1, timeout: int = 5000) -> tuple:
        """The `count`-th emission's arguments, once it has happened."""
        qtbot.waitUntil(lambda: len(self.calls) >= count, timeout=timeout)
        return self.calls[count - 1]


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
    root = tmp_path_factory.mktemp("qsettings")
    QCoreApplication.setOrganizationName("SpecLensTests")
    QCoreApplication.setApplicationName("SpecLensTests")
    for fmt in (QSettings.Format.IniFormat, QSettings.Format.NativeFormat):
        QSettings.setPath(fmt, QSettings.Scope.UserScope, str(root))
        QSettings.setPath(fmt, QSettings.Scope.SystemScope, str(root))
    QSettings.setDefaultFormat(QSettings.Format.IniFormat)
    yield root


@pytest.fixture
def qt_settings(tmp_path) -> QSettings:
    return QSettings(str(tmp_path / "speclens.ini"), QSettings.Format.IniFormat)


@pytest.fixture
def fake_engine() -> FakeEngine:
    return FakeEngine()


@pytest.fixture
def make_host(qapp):
    """Factory: an EngineHost over a given engine (or loader); shut down after the test."""
    from app.worker import EngineHost

    hosts = []

    def make(engine=None, **kw):
        kw.setdefault("controls_factory", FakeControls)
        kw.setdefault("lister", lambda: [])
        host = EngineHost(engine, **kw)
        hosts.append(host)
        return host

    yield make
    for h in hosts:
        assert h.shutdown(5000), "engine thread did not stop"


@pytest.fixture
def window(qtbot, qt_settings, fake_engine, make_host):
    from app.window import MainWindow

    w = MainWindow(make_host(fake_engine), qt_settings)
    qtbot.addWidget(w)
    w.show()
    qtbot.waitExposed(w)
    yield w
    w.host.cancel_all()


@pytest.fixture
def dialogs(monkeypatch) -> list[tuple[str, str, str]]:
    """QMessageBox static dialogs record (kind, title, text) instead of blocking."""
    seen: list[tuple[str, str, str]] = []

    def fake(kind):
        def show(parent, title, text, *args, **kwargs):
            seen.append((kind, title, text))
            return QMessageBox.StandardButton.Ok

        return show

    for kind in ("critical", "warning", "information", "question"):
        monkeypatch.setattr(QMessageBox, kind, staticmethod(fake(kind)))
    return seen


def wait_idle(qtbot, window, timeout: int = 10000) -> None:
    """Until the window's requests have all finished and their last frame is painted."""
    qtbot.waitUntil(lambda: not window.host.busy and window.active is None, timeout=timeout)
    window.repaint_frame()
