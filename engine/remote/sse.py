"""Server-sent events as OpenAI-compatible servers stream them: `data: {json}` lines, blank lines between events,
`data: [DONE]` at the end. Only `data:` fields matter to a chat stream; comments (`:`) and other fields are skipped."""
from __future__ import annotations

import json
from typing import Any

from engine.remote.errors import RemoteError

DONE = object()  # the `data: [DONE]` sentinel


def parse_line(line: str) -> Any:
    """One line of the stream: a decoded JSON payload, DONE, or None for a line that carries none."""
    if not line.startswith("data:"):
        if line.startswith("error:"):  # llama-server reports a failure mid-stream this way
            raise RemoteError(f"the server reported an error mid-reply: {_short(line[6:].strip())}")
        return None
    body = line[5:].strip()
    if body == "[DONE]":
        return DONE
    try:
        payload = json.loads(body)
    except json.JSONDecodeError as e:
        raise RemoteError(f"the server sent a malformed chunk ({e.msg} at character {e.pos}): {_short(body)}") from None
    except (ValueError, RecursionError):  # nested past the decoder's stack, or a number it cannot hold
        raise RemoteError(f"the server sent a chunk too deeply nested to read: {_short(body)}") from None
    if not isinstance(payload, dict):
        raise RemoteError(f"the server sent a chunk that is not a JSON object: {_short(body)}")
    if "error" in payload and "choices" not in payload:
        raise RemoteError(f"the server reported an error mid-reply: {_short(str(payload['error']))}")
    return payload


def _short(text: str, limit: int = 120) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"
