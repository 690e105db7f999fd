"""The one error attach mode raises: its message is a sentence for the user (no headers, no API key)."""
from __future__ import annotations


class RemoteError(Exception):
    """Talking to the server failed; str(e) says how, in one sentence."""
