"""json.loads in steps: the outer objects and arrays are walked here, and each value below `depth` is parsed by
the json module in one call. Between two calls another thread may run and `progress` hears how far the parse
is, so a reader thread opening a 100,000-round trace leaves the window live (one json.loads of the whole file
holds the interpreter for tens of seconds). The result and the errors are json.loads's: JSONDecodeError with the
position, the last of duplicate keys wins.
"""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

_SPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()

Progress = Callable[[float], None]  # the fraction of the text parsed; may raise to stop the parse


def loads_in_steps(text: str, progress: Progress | None = None, depth: int = 4) -> Any:
    report = progress or (lambda fraction: None)
    value, end = _value(text, _skip(text, 0), depth, report)
    end = _skip(text, end)
    if end != len(text):
        raise json.JSONDecodeError("Extra data", text, end)
    report(1.0)
    return value


def _skip(text: str, i: int) -> int:
    return _SPACE.match(text, i).end()


def _value(text: str, i: int, depth: int, report: Progress) -> tuple[Any, int]:
    opener = text[i:i + 1]
    if depth <= 0 or opener not in ("{", "["):
        try:
            return _DECODER.raw_decode(text, i)
        except StopIteration:  # raw_decode's way of saying nothing is there
            raise json.JSONDecodeError("Expecting value", text, i) from None
    return (_object if opener == "{" else _array)(text, i + 1, depth - 1, report)


def _array(text: str, i: int, depth: int, report: Progress) -> tuple[list[Any], int]:
    out: list[Any] = []
    i = _skip(text, i)
    if text[i:i + 1] == "]":
        return out, i + 1
    while True:
        item, i = _value(text, i, depth, report)
        out.append(item)
        report(i / len(text))
        i = _skip(text, i)
        sep = text[i:i + 1]
        if sep == "]":
            return out, i + 1
        if sep != ",":
            raise json.JSONDecodeError("Expecting ',' delimiter", text, i)
        i = _skip(text, i + 1)


def _object(text: str, i: int, depth: int, report: Progress) -> tuple[dict[str, Any], int]:
    out: dict[str, Any] = {}
    i = _skip(text, i)
    if text[i:i + 1] == "}":
        return out, i + 1
    while True:
        if text[i:i + 1] != '"':
            raise json.JSONDecodeError("Expecting property name enclosed in double quotes", text, i)
        key, i = _DECODER.raw_decode(text, i)
        i = _skip(text, i)
        if text[i:i + 1] != ":":
            raise json.JSONDecodeError("Expecting ':' delimiter", text, i)
        out[key], i = _value(text, _skip(text, i + 1), depth, report)
        i = _skip(text, i)
        sep = text[i:i + 1]
        if sep == "}":
            return out, i + 1
        if sep != ",":
            raise json.JSONDecodeError("Expecting ',' delimiter", text, i)
        i = _skip(text, i + 1)
