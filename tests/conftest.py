import os
import sys

import pytest
import torch

# Headless Qt for every test that opens a window; must be set before Qt is imported.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# Tiny test models are dominated by per-op overhead, which extra threads only add to; tests on the
# real embedded pair raise this again for their own duration.
torch.set_num_threads(1)

_exit_status: int | None = None


def pytest_sessionfinish(session, exitstatus):
    global _exit_status
    _exit_status = int(exitstatus)


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config):
    """Leave with pytest's own status once everything is reported, skipping interpreter finalization.

    After a session that has run many windows and a multi-GB engine, tearing down PySide6 and pyqtgraph
    objects during Python's module cleanup can segfault (seen only after the last test, never in one).
    Every result is already reported by now, and the status passed on is pytest's, so failures still fail.
    """
    if _exit_status is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(_exit_status)
