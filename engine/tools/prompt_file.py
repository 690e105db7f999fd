"""A benchmark's prompt file: JSON lines, each a chat ({"messages": [...]}) or a Spec-Bench question ({"turns": [...]}),
checked where it enters; every problem ends the command with one line naming the file and line."""
from __future__ import annotations

import json
from pathlib import Path
from typing import NoReturn

from engine.tools import specbench

PROG = "speclens-bench"


def fail(reason: str) -> NoReturn:
    raise SystemExit(f"{PROG}: {reason}")


def check_messages(row: object) -> None:
    """A prompt line must be {"messages": [{"role": str, "content": str}, ...]} (plus any other keys)."""
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got a {type(row).__name__}")
    messages = row.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ValueError("needs a non-empty 'messages' list")
    for i, m in enumerate(messages, 1):
        if not (isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)):
            raise ValueError(f"message {i} must be an object with string 'role' and 'content', got {m!r}")


def read_prompts(path: str | Path) -> list[dict]:
    p = Path(path)
    if not p.is_file():
        fail(f"prompts file not found: {p}")
    try:
        text = p.read_bytes().decode("utf-8")
    except OSError as e:
        fail(f"cannot read prompts file {p}: {e.strerror or e}")
    except UnicodeDecodeError as e:
        fail(f"{p} is not UTF-8 text (byte {e.start}: {e.reason})")
    prompts = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if isinstance(row, dict) and "turns" in row:  # Spec-Bench's own question format
                specbench.question(row)
            else:
                check_messages(row)
        except ValueError as e:  # json.JSONDecodeError is a ValueError
            fail(f"{p}:{n}: bad prompt line ({e})")
        prompts.append(row)
    if not prompts:
        fail(f"{p} holds no prompts")
    return prompts
