"""The context length a load asks for: how many tokens the conversation may hold, up to the chosen pair's limit,
with what its KV caches cost in memory beside it. Applied at the next load (the caches are sized then)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QHBoxLayout, QLabel, QSpinBox, QVBoxLayout, QWidget

from engine.api.config import DEFAULT_CONTEXT, DENSE_KV_BYTES

CONTEXT_MIN = 512
CONTEXT_ANY = 1 << 17  # the ceiling while the pair's own limit is unknown (a path no scan described)
CONTEXT_STEP = 1024


class ContextSetting(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.spin = QSpinBox()
        self.spin.setRange(CONTEXT_MIN, CONTEXT_ANY)
        self.spin.setSingleStep(CONTEXT_STEP)
        self.spin.setSuffix(" tokens")
        self.spin.setValue(DEFAULT_CONTEXT)
        self.spin.setToolTip("How many tokens the conversation may hold (system prompt, messages and replies): "
                             "the size of the KV caches. Applied at the next Load.")
        self.note = QLabel()
        self.note.setWordWrap(True)
        self.note.setStyleSheet("color: palette(placeholder-text);")
        self.note.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.wanted = DEFAULT_CONTEXT  # what the user chose; a pair with a lower limit shows less, not forgets it
        self._models: list[Any] = []
        self.in_use: int | None = None  # the loaded pair's context while the picker shows it (0: not reported)
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.spin, 1)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        lay.addLayout(row)
        lay.addWidget(self.note)
        self.spin.valueChanged.connect(self._on_value)
        self._describe()

    def tokens(self) -> int | None:
        """What a load should ask for; None for the default (the engine then picks it)."""
        return None if self.spin.value() == DEFAULT_CONTEXT else self.spin.value()

    def set_wanted(self, tokens: int) -> None:
        self.wanted = max(CONTEXT_MIN, int(tokens))
        self._apply_limit()

    def set_pair(self, models: Sequence[Any]) -> None:
        """The chosen target and draft (LocalModel-like: context_limit, kv_values_per_token; unknown ones left
        out)."""
        self._models = [m for m in models if m is not None]
        self._apply_limit()

    def set_in_use(self, tokens: int | None) -> None:
        """The picker shows the loaded pair, whose caches hold `tokens` (0: the engine did not say; None: it shows
        another pair, or none is loaded)."""
        if tokens != self.in_use:
            self.in_use = tokens
            self._describe()

    def limit(self) -> int | None:
        limits = [m.context_limit for m in self._models if getattr(m, "context_limit", 0)]
        return min(limits) if limits else None

    def kv_bytes(self, tokens: int) -> int | None:
        """Both caches at `tokens` positions on the CPU, or None when a model of the pair is unknown."""
        per = [getattr(m, "kv_values_per_token", 0) * getattr(m, "kv_bytes_per_value", DENSE_KV_BYTES)
               for m in self._models]
        if not per or not all(per):
            return None
        return sum(per) * tokens

    def _apply_limit(self) -> None:
        limit = self.limit() or CONTEXT_ANY
        self.spin.blockSignals(True)
        self.spin.setMaximum(max(CONTEXT_MIN, limit))
        self.spin.setValue(min(self.wanted, self.spin.maximum()))
        self.spin.blockSignals(False)
        self._describe()

    def _on_value(self, value: int) -> None:
        self.wanted = value
        self._describe()

    def _describe(self) -> None:
        tokens, limit, cost = self.spin.value(), self.limit(), self.kv_bytes(self.spin.value())
        # Up to: on the CPU the caches' pages are only touched, so only paid for, as the conversation grows
        ceiling = f" (this pair allows {limit:,})" if limit else ""
        if self.in_use is not None:  # the loaded pair: what it holds, and a size only where a scan described it
            held = f"Loaded with {self.in_use:,} tokens" if self.in_use else "Loaded"
            memory = f"; KV caches up to {cost / 1e9:.2f} GB at {tokens:,}" if cost is not None else ""
            self.note.setText(f"{held}{memory}{ceiling}; a change applies at the next Load.")
            return
        memory = f"KV caches up to {cost / 1e9:.2f} GB" if cost is not None else "KV cache size unknown for this pair"
        self.note.setText(f"{memory} at {tokens:,} tokens{ceiling}; applied at the next Load.")
