"""SpecLens desktop app: Qt views over the speculative-decoding engine.

Only `app.worker` (and `app.main`, which wires it) touches `engine.engine` and torch; every view here
works from the plain event dataclasses in `engine.events`.
"""

from app import compat  # noqa: F401  (first: guards against a PySide6 refcount defect, see app/compat.py)

__version__ = "0.1.0"
