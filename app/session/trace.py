"""Session traces: the whole session in one versioned JSON file, readable with no model loaded.

A trace holds every reply of the session (engine/analysis/stats.py MessageRecord: the messages sent, the settings and
models, every RoundEvent with its tokens, p/q, verdicts, timings and inspector rows, and the Summary), the
conversation, the settings in the controls and the models loaded when it was saved. The header names the format
and its version:

    {"format": "speclens-trace", "version": 1, "app_version": ..., "saved_at": ..., "models": ...,
     "settings": ..., "conversation": [...], "replies": [...]}

Readers ignore fields they do not know (a writer may add optional ones within a version); a change that an
older reader would misread bumps VERSION, and UPGRADES then brings older files up to date. No Qt here.
"""
from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from app.session.json_steps import loads_in_steps
from app.session.jsonable import FormatError, dump, load
from engine.analysis.stats import MessageRecord, file_mode
from engine.api.config import SamplingParams, SpecParams
from engine.api.messages import first_surrogate
from engine.api.protocol import EngineInfo

FORMAT = "speclens-trace"
VERSION = 1
# version -> a function that rewrites a file of that version as the next version would have written it.
UPGRADES: dict[int, Any] = {}
OLDEST = VERSION - len(UPGRADES)


class TraceError(Exception):
    """A trace that cannot be read or written; the message says why, for the user."""


@dataclass(frozen=True)
class Settings:
    """The controls when the trace was saved."""

    sampling: SamplingParams | None = None
    spec: SpecParams | None = None
    system_prompt: str = ""


@dataclass(frozen=True)
class Trace:
    replies: tuple[MessageRecord, ...]
    conversation: tuple[dict[str, str], ...] = ()
    models: EngineInfo | None = None  # loaded when saved; each reply also names the models that ran it
    settings: Settings = field(default_factory=Settings)
    app_version: str = ""
    saved_at: str = ""  # ISO 8601, UTC

    def __post_init__(self) -> None:
        if not all(isinstance(r, MessageRecord) for r in self.replies):
            raise ValueError("Trace.replies must hold MessageRecord values")

    @property
    def chat_replies(self) -> list[MessageRecord]:
        """What the chat showed (Compare's replays are kept too, but ran in their own dialog)."""
        return [r for r in self.replies if r.kind == "chat"]


def count_replies(replies: tuple[MessageRecord, ...] | list[MessageRecord]) -> str:
    """What a session's replies are, in words: the chat's, then the replays that ran in their own dialogs. One
    bare count ("8 replies") read as the chat's, beside a trace window showing its 3."""
    def n(count: int, one: str) -> str:
        return f"{count} {one if count == 1 else _plural(one)}"

    chat = sum(r.kind == "chat" for r in replies)
    compare = sum(r.kind.startswith("compare") for r in replies)
    tune = sum(r.kind == "tune" for r in replies)
    parts = [n(chat, "chat reply")] + [n(c, what) for c, what in ((compare, "Compare replay"),
                                                                  (tune, "Tune K replay")) if c]
    return ", ".join(parts)


def _plural(noun: str) -> str:
    return noun[:-1] + "ies" if noun.endswith("y") and not noun.endswith("ay") else noun + "s"


def session_trace(records: list[MessageRecord], conversation: list[dict[str, str]], models: EngineInfo | None,
                  settings: Settings, app_version: str) -> Trace:
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    return Trace(tuple(records), tuple(dict(m) for m in conversation), models, settings, app_version, now)


def to_json(trace: Trace) -> dict[str, Any]:
    body = dump(trace)
    return {"format": FORMAT, "version": VERSION, **body}


def from_json(data: Any, name: str = "The file") -> Trace:
    """A parsed JSON document -> Trace; TraceError says what is wrong with it."""
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise TraceError(f"{name} is not a SpecLens trace: it has no \"format\": \"{FORMAT}\" header.")
    version = data.get("version")
    if not isinstance(version, int) or isinstance(version, bool):
        raise TraceError(f"{name} is a SpecLens trace without a readable format version ({version!r}).")
    if version > VERSION:
        raise TraceError(f"{name} was saved by a newer SpecLens (trace format version {version}); this SpecLens "
                         f"reads {_readable()}. Update SpecLens to open it.")
    if version < OLDEST:
        raise TraceError(f"{name} uses trace format version {version}, older than any this SpecLens reads "
                         f"({_readable()}).")
    while version < VERSION:
        data, version = UPGRADES[version](data), version + 1
    body = {k: v for k, v in data.items() if k not in ("format", "version")}
    try:
        return load(Trace, body)
    except FormatError as e:
        raise TraceError(f"{name} is a damaged SpecLens trace: {e}.") from None


def _readable() -> str:
    return f"version {VERSION}" if OLDEST == VERSION else f"versions {OLDEST} to {VERSION}"


def read_trace(path: str | Path, progress: Callable[[float], None] | None = None) -> Trace:
    """`progress` hears the fraction of the file parsed, from a reader thread too (the parse leaves the
    interpreter to other threads between its steps); an exception it raises stops the read and passes through."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise TraceError(f"{path} could not be read: {e.strerror or e}.") from None
    except UnicodeDecodeError:
        raise TraceError(f"{path.name} is not a SpecLens trace: it is not UTF-8 text.") from None
    try:
        data = loads_in_steps(text, progress)
        del text  # half the memory of a large file; the parsed data takes the rest
        return from_json(data, path.name)
    except json.JSONDecodeError as e:
        raise TraceError(f"{path.name} is not valid JSON (line {e.lineno}, column {e.colno}: {e.msg}); the file "
                         "may be truncated or corrupt.") from None
    except RecursionError:
        raise TraceError(f"{path.name} is not a SpecLens trace: its JSON is nested deeper than any trace "
                         "(lists or objects inside each other thousands of levels deep).") from None
    except MemoryError:
        raise TraceError(f"{path.name} is too large to open in the memory this computer has free.") from None
    except ValueError as e:  # what json.loads refuses beyond syntax, e.g. an integer of thousands of digits
        raise TraceError(f"{path.name} is not a SpecLens trace: it holds a value that cannot be read "
                         f"({e}).") from None


def write_trace(trace: Trace, path: str | Path) -> Path:
    """Write atomically (a temporary file beside it, then a rename): a failed save never leaves half a file."""
    path = Path(path)
    text = json.dumps(to_json(trace), ensure_ascii=False, separators=(",", ":"))
    if first_surrogate(text) is not None:  # not UTF-8-encodable: JSON's \uXXXX escapes keep it exactly instead
        text = json.dumps(to_json(trace), ensure_ascii=True, separators=(",", ":"))
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(text)
            os.chmod(tmp, file_mode(path))  # mkstemp makes it private; a trace is made to be shared
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    except OSError as e:
        raise TraceError(f"{path} could not be written: {e.strerror or e}.") from None
    return path
