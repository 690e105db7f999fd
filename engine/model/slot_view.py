"""A pass's window on the KV pool whose every shape is fixed, for a captured CUDA graph (engine.model.step_graphs).

CacheView slices "the first end positions" and so changes shape every step. Here the pass reads every position
the sequence can reach (max_seq_len), gathered through a slot map built from the block table, and each row masks
the positions it may not see: past its own, those not yet written, and in a windowed layer those before its
window. Attention runs on the pass's rows padded to ROW_WISE_MAX (engine.model.attention.padded_rows).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.model.attention import ROW_WISE_MAX, padded_rows
from engine.model.kv_cache import KVPool


def slot_map(table: torch.Tensor, block_size: int, length: int) -> torch.Tensor:
    """The pool slot of each position [0, length), from a block table (blocks,) padded past its end."""
    pos = torch.arange(length, device=table.device)  # (S,)
    return table[pos // block_size] * block_size + pos % block_size  # (S,)


class SlotView:
    """Writes T consecutive positions from `start` (1,), and reads positions [0, S) of one sequence through `slots`."""

    def __init__(self, pool: KVPool, start: torch.Tensor, T: int, slots: torch.Tensor) -> None:
        self.pool, self.slots = pool, slots
        padded = start + torch.arange(ROW_WISE_MAX, device=slots.device)  # (R,): rows past T are padding
        self.positions = padded[:T]  # (T,)
        self.write = slots[self.positions]  # (T,)
        self._padded = padded
        self._seen = torch.arange(len(slots), device=slots.device)  # (S,)
        hidden = self._seen.unsqueeze(0) > padded.unsqueeze(1)  # (R, S): a row sees positions <= its own
        self.bias = torch.zeros(hidden.shape, device=slots.device).masked_fill(hidden, float("-inf"))  # (R, S)
        self._windowed: dict[int, torch.Tensor] = {}  # window -> its bias, made on first use (inside the capture)

    def _bias(self, window: int | None) -> torch.Tensor:
        """(R, S): 0 where a row may look, -inf past it and, with a window, at or before its position - window."""
        if window is None:
            return self.bias
        if window not in self._windowed:
            early = self._seen.unsqueeze(0) <= self._padded.unsqueeze(1) - window  # (R, S)
            self._windowed[window] = self.bias.masked_fill(early, float("-inf"))
        return self._windowed[window]

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (T, Hkv, D) and return K, V at every position (Hkv, S, D), in k's dtype."""
        kc, vc = self.pool.k[layer], self.pool.v[layer]  # (Hkv, slots, D)
        kc.index_copy_(1, self.write, k.transpose(0, 1).to(kc.dtype))
        vc.index_copy_(1, self.write, v.transpose(0, 1).to(vc.dtype))
        return kc.index_select(1, self.slots).to(k.dtype), vc.index_select(1, self.slots).to(v.dtype)

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, window: int | None = None,
               scale: float | None = None) -> torch.Tensor:
        """q (T, H, D) -> (T, H * D); a windowed layer's rows see the last `window` positions up to their own."""
        T = q.shape[0]
        padded = F.pad(q, (0, 0, 0, 0, 0, ROW_WISE_MAX - T))  # (R, H, D)
        return padded_rows(padded, keys, values, self._bias(window), scale)[:T]
