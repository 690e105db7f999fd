"""SpecLens desktop app: Qt views over the speculative-decoding engine.

The engine runs in a child process (see app.host); nothing in this package imports torch, and every view
works from the plain event dataclasses in `engine.api.events`.
"""

__version__ = "0.1.0"
