import os

import pytest
import torch

# The window's fixtures (a scripted engine, hosts, windows, an isolated QSettings) for every test folder.
pytest_plugins = ["tests.app_fixtures"]

# Headless Qt for every test that opens a window; must be set before Qt is imported.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# A benchmark main() run by a test is no result: it must not add a record to docs/results (engine/tools/results.py).
os.environ["SPECLENS_RESULTS"] = "off"
# Model listings look in no other app's folders (engine.io.model_dirs): a developer's own models never enter a test.
os.environ["SPECLENS_OTHER_APPS"] = "off"
# Tiny test models are dominated by per-op overhead, which extra threads only add to; tests on the
# real embedded pair raise this again for their own duration.
torch.set_num_threads(1)


@pytest.fixture(scope="module")
def kernels():
    """The compiled kernels' module. Where they did not build, the tests that need them are skipped: the pure-torch
    fallback has tests of its own, and the build's failures are tested in tests/kernels/test_kernel_build.py."""
    from engine.cpu import ext

    mod = ext.load()
    if mod is None:
        pytest.skip("the C++ kernels did not build here (see the logged reason)")
    return mod
