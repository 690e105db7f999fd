"""Run a computation under every instruction set this CPU has and 1 or 2 threads (the kernels promise the same
bits under all of them)."""
from __future__ import annotations

from collections.abc import Callable

import torch

from engine.cpu import ext


def outputs_per_isa_and_threads(compute: Callable[[], torch.Tensor]) -> dict[tuple[str, int], torch.Tensor]:
    kernels = ext.load()
    before, threads = kernels.isa(), torch.get_num_threads()
    outs = {}
    try:
        for isa in kernels.supported_isas():
            kernels.set_isa(isa)
            for t in (1, 2):
                torch.set_num_threads(t)
                outs[(isa, t)] = compute()
    finally:
        kernels.set_isa(before)
        torch.set_num_threads(threads)
    return outs
