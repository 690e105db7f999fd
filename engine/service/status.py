"""The engine process's answer to QueryStatus: its memory and the KV blocks free in each pool."""
from __future__ import annotations

import os
from typing import Any

from engine.api.protocol import EngineStatus


def engine_status(engine: Any, busy: bool) -> EngineStatus:
    """`busy` is read by the caller before the blocks are counted here (see Service.status)."""
    target = _blocks(getattr(engine, "target_pool", None))
    draft = _blocks(getattr(getattr(engine, "model_drafter", None), "pool", None))
    return EngineStatus(pid=os.getpid(), rss_bytes=rss_bytes(), busy=busy,
                        target_free_blocks=target[0], target_total_blocks=target[1],
                        draft_free_blocks=draft[0], draft_total_blocks=draft[1])


def rss_bytes() -> int:
    """This process's resident set size (Linux /proc; elsewhere the peak from getrusage)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _blocks(pool: Any) -> tuple[int | None, int | None]:
    manager = getattr(pool, "manager", None)
    return (manager.num_free, manager.num_blocks) if manager is not None else (None, None)
