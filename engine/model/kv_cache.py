"""Paged KV cache: a pure-Python block manager plus one preallocated tensor pool per model.

The block manager owns all bookkeeping (free list, block tables, lengths) and never touches torch,
so it can be tested on its own. KVPool holds the tensors and maps token positions to pool slots.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import torch

from engine.model import pages
from engine.model.attention import causal_attention


class CacheFullError(RuntimeError):
    """Raised before any state changes when a sequence cannot grow."""


@dataclass
class BlockManager:
    num_blocks: int
    block_size: int
    max_seq_len: int
    _free: list[int] = field(init=False)
    _tables: dict[int, list[int]] = field(init=False, default_factory=dict)
    _lengths: dict[int, int] = field(init=False, default_factory=dict)

    def __post_init__(self) -> None:
        if self.num_blocks < 1 or self.block_size < 1 or self.max_seq_len < 1:
            raise ValueError("num_blocks, block_size and max_seq_len must all be >= 1")
        # A stack with block 0 on top: a lone sequence gets consecutive blocks, and blocks freed by a
        # rollback are pushed back so the same ones are reused (keeps the table contiguous).
        self._free = list(range(self.num_blocks - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def allocate(self, seq: int) -> None:
        if seq in self._tables:
            raise ValueError(f"sequence {seq} already exists")
        self._tables[seq] = []
        self._lengths[seq] = 0

    def length(self, seq: int) -> int:
        return self._lengths[seq]

    def block_table(self, seq: int) -> list[int]:
        return list(self._tables[seq])

    def blocks_needed(self, seq: int, n: int) -> int:
        """Extra blocks that appending n tokens to seq would take."""
        have = len(self._tables[seq])
        need = -(-(self._lengths[seq] + n) // self.block_size)
        return max(0, need - have)

    def append(self, seq: int, n: int) -> tuple[int, int]:
        """Grow seq by n tokens; returns the new positions [start, end). Checks everything first."""
        if n < 0:
            raise ValueError(f"cannot append {n} tokens")
        start = self._lengths[seq]
        if start + n > self.max_seq_len:
            raise CacheFullError(
                f"sequence would reach {start + n} tokens, past the context length {self.max_seq_len}"
            )
        extra = self.blocks_needed(seq, n)
        if extra > len(self._free):
            raise CacheFullError(
                f"KV cache out of blocks: need {extra} more, {len(self._free)} free of {self.num_blocks}"
            )
        table = self._tables[seq]
        for _ in range(extra):
            table.append(self._free.pop())
        self._lengths[seq] = start + n
        return start, start + n

    def truncate_to(self, seq: int, n: int) -> None:
        """Roll seq back to its first n tokens; blocks wholly past n go back to the pool."""
        if not 0 <= n <= self._lengths[seq]:
            raise ValueError(f"cannot truncate sequence of length {self._lengths[seq]} to {n}")
        table = self._tables[seq]
        keep = -(-n // self.block_size)
        released = table[keep:]
        del table[keep:]
        self._free.extend(reversed(released))
        self._lengths[seq] = n

    def free(self, seq: int) -> None:
        self.truncate_to(seq, 0)
        del self._tables[seq]
        del self._lengths[seq]

    def slots(self, seq: int, start: int, end: int) -> list[int]:
        """Pool slot index of each position in [start, end)."""
        table, bs = self._tables[seq], self.block_size
        return [table[p // bs] * bs + p % bs for p in range(start, end)]

    def contiguous_base(self, seq: int) -> int | None:
        """First slot when seq's blocks are consecutive in the pool (so its KV is one slice), else None."""
        table = self._tables[seq]
        if not table:
            return 0
        first = table[0]
        return first * self.block_size if table == list(range(first, first + len(table))) else None


class KVPool:
    """K and V tensors for every layer: (L, H_kv, num_blocks * block_size, D).

    Head-major: one KV head's keys sit one after another, so attention over a run of positions reads one
    contiguous stretch per head rather than every other half of each slot. The dtype may be narrower than the
    model's (a GGUF model's is float16: Transformer.kv_dtype): values are rounded once, when written."""

    def __init__(
        self, num_layers: int, num_kv_heads: int, head_dim: int, manager: BlockManager,
        dtype: torch.dtype, device: torch.device | str,
    ) -> None:
        self.manager = manager
        n_slots = manager.num_blocks * manager.block_size
        shape = (num_layers, num_kv_heads, n_slots, head_dim)
        # On the CPU in lazily zeroed pages (engine.model.pages): slots a short chat never reaches cost no memory
        alloc = pages.zeros if torch.device(device).type == "cpu" else partial(torch.zeros, device=device)
        self.k = alloc(shape, dtype=dtype)  # (L, Hkv, S, D)
        self.v = alloc(shape, dtype=dtype)  # (L, Hkv, S, D)

    def view(self, seq: int, start: int, end: int) -> CacheView:
        """Where a forward pass writing positions [start, end) of seq puts and reads its KV."""
        m = self.manager
        device = self.k.device
        write = torch.tensor(m.slots(seq, start, end), dtype=torch.long, device=device)
        base = m.contiguous_base(seq)
        read = None if base is not None else torch.tensor(m.slots(seq, 0, end), dtype=torch.long, device=device)
        return CacheView(self, write, read, base or 0, end, seq)


@dataclass
class CacheView:
    """One forward pass's window on the pool: write the new positions, read positions [0, end)."""

    pool: KVPool
    write_slots: torch.Tensor  # (T,)
    read_slots: torch.Tensor | None  # (S,) when the blocks are scattered; None for one contiguous slice
    base: int
    end: int
    seq: int = 0

    @property
    def positions(self) -> slice:
        """The positions the pass writes, [end - T, end)."""
        return slice(self.end - len(self.write_slots), self.end)

    def attend(self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, window: int | None = None,
               scale: float | None = None) -> torch.Tensor:
        """q (T, H, D) over the keys and values update returned -> (T, H * D); a windowed layer's rows see the last
        `window` positions up to their own."""
        return causal_attention(q, keys, values, window, scale)

    def update(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store k, v (T, Hkv, D) and return the whole sequence's K, V (Hkv, S, D), in k's dtype (a float16 pool's
        values widened exactly, as the C++ stack reads them)."""
        kc, vc = self.pool.k[layer], self.pool.v[layer]  # (Hkv, slots, D)
        kc.index_copy_(1, self.write_slots, k.transpose(0, 1).to(kc.dtype))
        vc.index_copy_(1, self.write_slots, v.transpose(0, 1).to(vc.dtype))
        if self.read_slots is None:
            keys, values = kc[:, self.base : self.base + self.end], vc[:, self.base : self.base + self.end]
        else:
            keys, values = kc.index_select(1, self.read_slots), vc.index_select(1, self.read_slots)
        return keys.to(k.dtype), values.to(v.dtype)
