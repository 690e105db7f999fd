"""Work around a reference-count defect in some PySide6 builds on Python < 3.12.

PySide6 6.12.0 (abi3 wheels) returns None from every C++ `void` method without taking a reference to it. On
Python 3.12+ None is immortal (PEP 683) and nothing happens; on 3.11 each call lowers None's reference count
by one, and after some tens of thousands of calls (seconds of streaming into a QTextDocument) the interpreter
aborts with "Fatal Python error: none_dealloc". True and False leak the same way through other paths
(pyqtgraph's repaints reach "bool_dealloc"). When, and only when, a quick probe shows the defect, we give those
three singletons a very large reference count: what 3.12 does, so the leaked decrements never reach zero.
"""
from __future__ import annotations

import sys

PROBE_CALLS = 64
RESERVE = 1 << 48  # ~2.8e14 leaked calls before this would run out


def void_calls_leak_none() -> bool:
    """Call a void Qt method a few times and see whether None lost a reference each time."""
    from PySide6.QtCore import QPoint

    point = QPoint()
    before = sys.getrefcount(None)
    for _ in range(PROBE_CALLS):
        point.setX(1)
    return sys.getrefcount(None) <= before - PROBE_CALLS


def pin_none() -> bool:
    """Returns True when the defect was found and None, True and False are now effectively immortal."""
    if sys.version_info >= (3, 12) or sys.implementation.name != "cpython":
        return False
    if not void_calls_leak_none():
        return False
    import ctypes

    # CPython < 3.12: PyObject starts with Py_ssize_t ob_refcnt, and id() is the object's address.
    for singleton in (None, True, False):
        ctypes.c_ssize_t.from_address(id(singleton)).value += RESERVE
    return True


SINGLETONS_PINNED = pin_none()
