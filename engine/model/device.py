"""Where the models run: CUDA in bf16 when there is a GPU, else the CPU in fp32."""
from __future__ import annotations

import torch


def pick_device(device: str | None = None) -> tuple[torch.device, torch.dtype]:
    """CUDA in bf16 when there is a GPU, else the CPU in fp32; `device` overrides."""
    dev = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return dev, (torch.bfloat16 if dev.type == "cuda" else torch.float32)
