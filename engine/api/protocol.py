"""Every message between the window's process and the engine's, as a frozen dataclass. No torch, no Qt: both
processes import this.

Commands (window -> engine). Load, Scan, Generate and Reset run one at a time in the order sent; the others act
at once, so they reach a running request between two of its rounds.

    Load(target, draft, device, context)   target None: the embedded default pair; context: KV cache tokens
    CancelLoad()                       the running load stops at its next progress check
    Scan()                             list the local models for the picker
    Generate(rid, messages, sampling, spec, stepping, plain_every)   stepping: pause after each phase of a round;
                                       plain_every: a plain step on rounds engine.api.live.plain_step_due names
    UpdateControls(rid, sampling, spec)   live settings, read by the engine at the start of its next round
    Cancel(rid)                        rid None: every request, running or queued
    Reset()                            forget the cached conversation
    QueryStatus()                      answered at once with EngineStatus, even mid-request
    Step(rid)                          step-through: the paused request runs to its next phase
    Continue(rid)                      step-through off for this request: it runs on without pausing
    SetStepping(rid, on)               step-through on or off mid-request (on: it pauses at its next phase)
    Shutdown()                         cancel everything, then exit

Events (engine -> window):

    Started(pid, protocol)             first, once the loop runs
    LoadProgress(stage, fraction)      zero or more (at most ~20/s), then exactly one of:
    Loaded(EngineInfo) | LoadFailed(message) | LoadCancelled()
    ModelsListed(models)               answers Scan
    Rounds(rid, events)                in order; batched to at most ~60 messages/s
    Prefilling(rid, progress)          a long prompt's reading, after each chunk (at most ~10/s, the last always)
    PhaseReached(rid, event)           step-through only: the request now waits for a command; every round
                                       before it was sent first
    RequestSummary(rid, summary)       once per request that reached a stop or a cancel ...
    Errored(rid, message)              ... or once per request that failed
    Finished(rid)                      always, last for every request (also one cancelled in the queue, which
                                       sends nothing else)
    EngineStatus(...)                  answers QueryStatus
    Fatal(message)                     the loop itself failed; the process exits with status 1
    CommandError(problem)              a command was malformed or refused; the engine serves on

Pickling skips __init__, so a receiver checks what arrives with `problem()`; a sender's mistakes fail at once,
in __post_init__.
"""
from __future__ import annotations

import functools
import reprlib
import types
import typing
from collections.abc import Collection
from dataclasses import dataclass, fields, is_dataclass
from typing import Any

from engine.api.config import SamplingParams, SpecParams
from engine.api.events import PhaseEvent, PrefillProgress, RoundEvent, Summary

# A change either side would misread bumps this; the window checks the engine's in Started.
PROTOCOL_VERSION = 3

Messages = list[dict[str, str]]


class _Checked:
    """A message whose fields hold what their type hints say (checked when it is built)."""

    def __post_init__(self) -> None:
        wrong = field_problem(self)
        if wrong is not None:
            raise TypeError(wrong)


# ---- commands ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Load(_Checked):
    target: str | None
    draft: str | None
    device: str | None
    context: int | None = None  # the KV cache's length in tokens; None: the models' limit, at most 4096


@dataclass(frozen=True)
class CancelLoad(_Checked):
    pass


@dataclass(frozen=True)
class Scan(_Checked):
    pass


@dataclass(frozen=True)
class Generate(_Checked):
    rid: int
    messages: Messages
    sampling: SamplingParams
    spec: SpecParams
    stepping: bool = False
    plain_every: int = 0  # 0: no plain steps but those the spec asks for; else runs of them (live.plain_step_due)


@dataclass(frozen=True)
class UpdateControls(_Checked):
    rid: int
    sampling: SamplingParams
    spec: SpecParams


@dataclass(frozen=True)
class Cancel(_Checked):
    rid: int | None


@dataclass(frozen=True)
class Reset(_Checked):
    pass


@dataclass(frozen=True)
class QueryStatus(_Checked):
    pass


@dataclass(frozen=True)
class Step(_Checked):
    rid: int


@dataclass(frozen=True)
class Continue(_Checked):
    rid: int


@dataclass(frozen=True)
class SetStepping(_Checked):
    rid: int
    on: bool


@dataclass(frozen=True)
class Shutdown(_Checked):
    pass


COMMANDS: tuple[type, ...] = (Load, CancelLoad, Scan, Generate, UpdateControls, Cancel, Reset, QueryStatus,
                              Step, Continue, SetStepping, Shutdown)


# ---- events --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class EngineInfo:
    """The engine now in use, as the window names it."""

    target_name: str
    draft_name: str | None
    device: str
    dtype_name: str
    notice: str = ""  # a sentence the window keeps in view (no compiled CPU kernels: slow, and the remedy)
    context: int = 0  # the tokens the conversation may hold (the KV cache's length); 0: not reported


@dataclass(frozen=True)
class Started(_Checked):
    pid: int
    protocol: int = PROTOCOL_VERSION


@dataclass(frozen=True)
class LoadProgress(_Checked):
    stage: str
    fraction: float  # in [0, 1]; < 0: a stage of unknown length


@dataclass(frozen=True)
class Loaded(_Checked):
    info: EngineInfo


@dataclass(frozen=True)
class LoadFailed(_Checked):
    message: str  # one readable line; the previous engine (if any) stays in use


@dataclass(frozen=True)
class LoadCancelled(_Checked):
    pass


@dataclass(frozen=True)
class ModelsListed(_Checked):
    models: list[Any]  # engine.io.hub.LocalModel (a layer above this one)


@dataclass(frozen=True)
class Rounds(_Checked):
    rid: int
    events: list[RoundEvent]


@dataclass(frozen=True)
class Prefilling(_Checked):
    rid: int
    progress: PrefillProgress


@dataclass(frozen=True)
class PhaseReached(_Checked):
    rid: int
    event: PhaseEvent


@dataclass(frozen=True)
class RequestSummary(_Checked):
    rid: int
    summary: Summary


@dataclass(frozen=True)
class Errored(_Checked):
    rid: int
    message: str


@dataclass(frozen=True)
class Finished(_Checked):
    rid: int


@dataclass(frozen=True)
class EngineStatus(_Checked):
    pid: int
    rss_bytes: int
    busy: bool  # a job runs or waits (load, generate, reset, scan)
    target_free_blocks: int | None  # None where the engine has no KV pool
    target_total_blocks: int | None
    draft_free_blocks: int | None
    draft_total_blocks: int | None


@dataclass(frozen=True)
class Fatal(_Checked):
    message: str


@dataclass(frozen=True)
class CommandError(_Checked):
    problem: str  # names the command and what was wrong with it


EVENTS: tuple[type, ...] = (Started, LoadProgress, Loaded, LoadFailed, LoadCancelled, ModelsListed, Rounds,
                            Prefilling, PhaseReached, RequestSummary, Errored, Finished, EngineStatus, Fatal, CommandError)


# ---- checking ------------------------------------------------------------------------------------------------
def problem(message: object, accepted: Collection[type]) -> str | None:
    """What is wrong with a received message (None: nothing): not one of the `accepted` types, a field whose
    value does not match its type hint, or decoding settings their own checks refuse. Whatever arrives, this
    answers: its walk and its description of a value are bounded in depth and size."""
    if type(message) not in accepted:
        return f"not a message this side reads: {_short(message)}"
    return field_problem(message)


def field_problem(message: object) -> str | None:
    hints = _hints(type(message))
    for f in fields(message):  # type: ignore[arg-type] - every message is a dataclass
        value = getattr(message, f.name, _MISSING)
        if value is _MISSING:
            return f"{type(message).__name__}.{f.name} is missing"
        if not _fits(value, hints[f.name]):
            return f"{type(message).__name__}.{f.name} must be {_name(hints[f.name])}, got {_short(value)}"
        if type(value) in _SELF_CHECKED and (wrong := _settings_problem(value)) is not None:
            return f"{type(message).__name__}.{f.name}: {wrong}"
    if isinstance(message, Load) and message.context is not None and not 2 <= message.context < 2**31:
        return f"Load.context must be None or a token count in [2, 2**31), got {_short(message.context)}"
    return None


# Values whose __post_init__ checks them. Unpickling skips __init__, so a received one is checked again here:
# SpecParams(k=0) built past its check would otherwise reach a round and fail there, and a prefill's progress past
# its total would reach the window's status line.
_SELF_CHECKED = (SamplingParams, SpecParams, PrefillProgress)


def _settings_problem(value: Any) -> str | None:
    try:
        type(value).__post_init__(value)  # normalizes in place what it would have (stop strings), else only reads
    except (ValueError, TypeError) as e:
        return _cut(str(e), 200)
    except AttributeError as e:  # a field left out
        return f"{type(value).__name__} is incomplete ({_cut(str(e), 120)})"
    return None


def version_problem(protocol: object) -> str | None:
    """The sentence the window shows when the engine process speaks another protocol version than it does
    (None: the same). Such a pair comes from two installs mixed; nothing either says can be trusted."""
    if protocol == PROTOCOL_VERSION:
        return None
    return (f"it speaks protocol version {_short(protocol, 20)} and this window version {PROTOCOL_VERSION}, so "
            "parts of two SpecLens versions are installed together; reinstall SpecLens.")


_MISSING = object()


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _fits(value: object, hint: Any) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if hint in (int, float):  # bool is an int to isinstance, never to a message; an int is a fine float
        return isinstance(value, (int, float) if hint is float else int) and not isinstance(value, bool)
    if origin is list:
        return isinstance(value, list) and all(_fits(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(_fits(k, args[0]) and _fits(v, args[1]) for k, v in value.items())
    return isinstance(value, hint)


def _name(hint: Any) -> str:
    plain = typing.get_origin(hint) is None and hasattr(hint, "__name__")
    return hint.__name__ if plain else str(hint).replace("typing.", "")


class _BoundedRepr(reprlib.Repr):
    """repr that stops a few levels down and a few items across: a received value may nest 20,000 lists deep
    (the builtin repr recurses past Python's stack) or hold a megabyte string."""

    def __init__(self) -> None:
        super().__init__()  # keyword limits only from Python 3.12
        self.maxlevel, self.maxstring, self.maxother, self.maxlong = 4, 60, 60, 40
        self.maxlist = self.maxtuple = self.maxdict = self.maxset = self.maxfrozenset = self.maxdeque = 8

    def repr_instance(self, x: Any, level: int) -> str:
        if is_dataclass(x) and not isinstance(x, type):  # fields through this repr, not the class's own
            if level <= 0:
                return f"{type(x).__name__}(...)"
            parts = [f"{f.name}={self.repr1(getattr(x, f.name, '?'), level - 1)}" for f in fields(x)[:8]]
            return f"{type(x).__name__}({', '.join(parts)})"
        return super().repr_instance(x, level)


_BOUNDED = _BoundedRepr()


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _short(value: object, limit: int = 80) -> str:
    try:
        text = _BOUNDED.repr(value)
    except Exception:  # noqa: BLE001 - a hostile __repr__: name the type and nothing more
        text = f"<{type(value).__name__}>"
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"
