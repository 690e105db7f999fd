"""How the engine process puts what happened into words and values for the window."""
from __future__ import annotations

import traceback
from typing import Any

from engine.api.protocol import EngineInfo

# Errors whose message is written for the user: shown as they are, without their type's name
SPEAKING_ERRORS = ("ModelLoadError", "ProvisionError", "FileNotFoundError", "ContextFullError")


def describe_error(e: BaseException) -> str:
    """One line for the user: known engine errors speak for themselves, anything else names its type."""
    name = type(e).__name__
    if name in SPEAKING_ERRORS:
        return str(e) or name
    return f"{name}: {e}" if str(e) else name


def log_failure(log: Any, what: str, e: BaseException) -> None:
    """A refusal written for the user is one line in the log; anything else keeps its traceback, for a bug report."""
    if type(e).__name__ in SPEAKING_ERRORS:
        log.warning("%s: %s", what, describe_error(e))
    else:
        log.warning("%s:\n%s", what, "".join(traceback.format_exception(e)))


def info_of(engine: Any) -> EngineInfo:
    return EngineInfo(str(engine.target_name), engine.draft_name, str(getattr(engine, "device", "cpu")),
                      str(getattr(engine, "dtype_name", "")), str(getattr(engine, "kernels_notice", "")),
                      int(getattr(engine, "max_seq_len", 0) or 0))
