"""The installed Qt bindings keep Python's reference counts right (see the PySide6 pin in pyproject.toml).

PySide6 6.12.0 on Python 3.11 returned None from C++ void methods without a reference: every call lowered
None's count by one until the interpreter aborted. The app must never run on such a build again.
"""
import os
import sys

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

CALLS = 2000


def lost_refs(obj, call) -> int:
    before = sys.getrefcount(obj)
    for _ in range(CALLS):
        call()
    return before - sys.getrefcount(obj)


def test_void_and_bool_calls_keep_singleton_refcounts(qapp):
    from PySide6.QtCore import QPoint, QRect
    from PySide6.QtWidgets import QWidget

    point, rect, widget = QPoint(), QRect(0, 0, 4, 4), QWidget()
    assert lost_refs(None, lambda: point.setX(1)) < CALLS // 2
    assert lost_refs(None, lambda: widget.setEnabled(True)) < CALLS // 2
    assert lost_refs(True, rect.isValid) < CALLS // 2
    assert lost_refs(False, rect.isNull) < CALLS // 2
