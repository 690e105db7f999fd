"""Dataclasses to JSON values and back, guided by their type hints: how a trace stores engine events.

`dump` turns a value into dicts, lists, strings, numbers, booleans and None. `load(T, data)` rebuilds a T and
checks every value against its field's type on the way, so a damaged file is refused with the path of what is
wrong ("rounds[3].drafted[0].p: expected a number, got 'x'") rather than failing later in a view. Fields the
reader does not know are ignored and missing ones with a default take it: within one trace format version, a
writer may add optional fields. Python floats survive the round trip exactly (json writes their shortest repr).
"""
from __future__ import annotations

import dataclasses
import functools
import math
import types
import typing
from enum import Enum
from typing import Any


class FormatError(ValueError):
    """The data does not fit the expected type; the message names where."""


def dump(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: dump(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [dump(v) for v in value]
    if isinstance(value, dict):
        return {str(k): dump(v) for k, v in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)  # "inf", "nan": strict JSON has no such numbers
    return value


def load(tp: Any, data: Any, where: str = "") -> Any:
    if type(data) is tp and tp in _EXACT:  # most fields of a trace: a scalar, as JSON gives it back
        return data
    origin, args = _shape(tp)
    if tp is Any:
        return data
    if origin in (typing.Union, types.UnionType):
        if data is None and type(None) in args:
            return None
        if type(data) in _EXACT and type(data) in args:
            return data
        arms = [a for a in args if a is not type(None)]
        errors = []
        for arm in arms:
            try:
                return load(arm, data, where)
            except FormatError as e:
                errors.append(e)
        raise errors[0] if len(errors) == 1 else FormatError(f"{where or 'value'}: unexpected {_show(data)}")
    if origin is typing.Literal:
        if data in args:
            return data
        raise FormatError(f"{where}: expected one of {', '.join(map(repr, args))}, got {_show(data)}")
    if origin in (tuple, list):
        if not isinstance(data, list):
            raise FormatError(f"{where}: expected a list, got {_show(data)}")
        if origin is tuple and not (len(args) == 2 and args[1] is Ellipsis):
            if len(data) != len(args):
                raise FormatError(f"{where}: expected {len(args)} items, got {len(data)}")
            return tuple(load(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, data)))
        elem = args[0] if args else Any
        if elem in _EXACT and all(type(v) is elem for v in data):  # the bulk of a trace (p, q, ids, texts): one pass
            return tuple(data) if origin is tuple else list(data)
        items = [load(args[0] if args else Any, v, f"{where}[{i}]") for i, v in enumerate(data)]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if not isinstance(data, dict):
            raise FormatError(f"{where}: expected an object, got {_show(data)}")
        return {k: load(args[1] if args else Any, v, f"{where}.{k}") for k, v in data.items()}
    if isinstance(tp, type) and issubclass(tp, Enum):
        try:
            return tp(data)
        except ValueError:
            names = ", ".join(repr(m.value) for m in tp)
            raise FormatError(f"{where}: expected one of {names}, got {_show(data)}") from None
    if dataclasses.is_dataclass(tp):
        return _load_dataclass(tp, data, where)
    return _load_scalar(tp, data, where)


def _load_dataclass(cls: type, data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise FormatError(f"{where or cls.__name__}: expected an object, got {_show(data)}")
    kwargs = {}
    for name, hint, required in _fields(cls):
        if name in data:
            kwargs[name] = load(hint, data[name], f"{where}.{name}" if where else name)
        elif required:
            raise FormatError(f"{where or cls.__name__}: missing {name!r}")
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:  # the class's own checks (__post_init__)
        raise FormatError(f"{where or cls.__name__}: {e}") from None


# Element types a list may hold as JSON gives them back, so a list of them is checked without a call per item
# (a 100,000-round trace holds tens of millions). Floats may also arrive as ints or "nan": the slow path reads those.
_EXACT = (float, int, str, bool)


@functools.cache
def _shape(tp: Any) -> tuple[Any, tuple[Any, ...]]:
    return typing.get_origin(tp), typing.get_args(tp)


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, Any, bool], ...]:
    """(name, type hint, required) of each field __init__ takes, worked out once per class."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name], f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
                 for f in dataclasses.fields(cls) if f.init)


def _load_scalar(tp: Any, data: Any, where: str) -> Any:
    if tp is float:
        if isinstance(data, str) and data in ("inf", "-inf", "nan"):
            return float(data)
        if isinstance(data, (int, float)) and not isinstance(data, bool):
            return float(data)
        raise FormatError(f"{where}: expected a number, got {_show(data)}")
    if tp is int:
        if isinstance(data, int) and not isinstance(data, bool):
            return data
        raise FormatError(f"{where}: expected a whole number, got {_show(data)}")
    if tp in (str, bool):
        if type(data) is tp:
            return data
        raise FormatError(f"{where}: expected {'text' if tp is str else 'true or false'}, got {_show(data)}")
    if tp is type(None):
        if data is None:
            return None
        raise FormatError(f"{where}: expected null, got {_show(data)}")
    raise TypeError(f"jsonable.load cannot read type {tp!r}")  # a programming error, not a damaged file


def _show(data: Any) -> str:
    text = repr(data)
    return text if len(text) <= 40 else text[:37] + "..."
