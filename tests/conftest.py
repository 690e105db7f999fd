import os

import torch

# Headless Qt for every test that opens a window; must be set before Qt is imported.
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# Tiny test models are dominated by per-op overhead, which extra threads only add to; tests on the
# real embedded pair raise this again for their own duration.
torch.set_num_threads(1)
