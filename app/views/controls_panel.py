"""The right-hand control panel: model picker, speculation and sampling settings, system prompt.

Everything here produces plain values (SamplingParams, SpecParams, paths); the window pushes them into the
running request's Controls on every `changed` signal, so they take effect at the engine's next round.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from PySide6.QtCore import QSettings, Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QSlider,
    QSpinBox,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from app.views.context_setting import ContextSetting
from engine.api.config import APP_DEFAULTS, NEEDS_DRAFT_MODEL, SamplingParams, SpecParams
from engine.io.model_dirs import SOURCE_NAMES, size_text

K_MIN = 1
SEED_RANDOM = -1


def _slider(lo: int, hi: int, value: int, page: int) -> QSlider:
    s = QSlider(Qt.Orientation.Horizontal)
    s.setRange(lo, hi)
    s.setValue(value)
    s.setPageStep(page)
    s.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
    return s


def _with_value(slider: QSlider, label: QLabel) -> QWidget:
    w = QWidget()
    lay = QHBoxLayout(w)
    lay.setContentsMargins(0, 0, 0, 0)
    lay.addWidget(slider, 1)
    label.setMinimumWidth(64)
    label.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
    lay.addWidget(label)
    return w


def describe_model(m: Any) -> str:
    """One picker line: name, size, family and quantization, and which app keeps it."""
    size = size_text(getattr(m, "params_b", None))
    facts = " ".join(f for f in (size, m.arch, getattr(m, "quant", "") or "") if f)
    where = SOURCE_NAMES.get(getattr(m, "source", ""), "")
    name = m.name
    if getattr(m, "source", "") in ("lm-studio", "llama.cpp"):  # publisher/repo/file: the file says which model,
        name = name.rsplit("/", 1)[-1]  # and the item's tooltip has the whole path
    return f"{name}  \u00b7 {facts}" + (f"  \u00b7 {where}" if where else "")


def runs_here(m: Any) -> bool:
    """A listed model SpecLens can load; one it refuses carries why_not (listed, greyed out, with the reason)."""
    return not getattr(m, "why_not", "")


class ControlsPanel(QWidget):
    changed = Signal()  # a live setting changed: the window forwards it to the running request
    loadRequested = Signal(object, object)  # target path (None: the embedded pair), draft path or None
    rescanRequested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._models: list[Any] = []
        self._named: list[str] = []  # paths a load named that the scan did not list (--target, Open model folder)
        self.saved_pair: tuple[str | None, str | None] = (None, None)  # the picker's choice last session
        # The pair the engine has loaded now (paths; None: the embedded pair) and its context; None before a load
        self.loaded_pair: tuple[str | None, str | None] | None = None
        self.loaded_context = 0
        outer = QVBoxLayout(self)
        outer.setContentsMargins(6, 6, 6, 6)
        outer.setSpacing(8)
        outer.addWidget(self._model_box())
        outer.addWidget(self._speculation_box())
        outer.addWidget(self._sampling_box())
        outer.addWidget(self._system_box())
        outer.addStretch(1)
        self._connect()
        self.set_local_models([])
        self.update_labels()

    def _model_box(self) -> QGroupBox:
        box = QGroupBox("Model")
        form = QFormLayout(box)
        self.target_combo = QComboBox()
        self.target_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.target_combo.setMinimumContentsLength(12)  # the panel fits beside the inspector at 1280 px
        self.draft_combo = QComboBox()
        self.draft_combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.draft_combo.setMinimumContentsLength(12)  # the panel fits beside the inspector at 1280 px
        self.load_button = QPushButton("Load")
        self.load_button.setToolTip("Load the chosen pair in the background")
        self.rescan_button = QToolButton()
        self.rescan_button.setText("Rescan")
        self.rescan_button.setToolTip("Look for local models again (the Hugging Face cache, LM Studio, Ollama and "
                                      "llama.cpp's folders)")
        buttons = QHBoxLayout()
        buttons.addWidget(self.rescan_button)
        buttons.addStretch(1)
        buttons.addWidget(self.load_button)
        self.loaded_label = QLabel("No model loaded")
        self.loaded_label.setWordWrap(True)
        self.loaded_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.context = ContextSetting()
        form.addRow("Target", self.target_combo)
        form.addRow("Draft", self.draft_combo)
        form.addRow("Context", self.context)
        form.addRow(buttons)
        form.addRow(self.loaded_label)
        return box

    def _speculation_box(self) -> QGroupBox:
        box = QGroupBox("Speculation")
        form = QFormLayout(box)
        self.spec_toggle = QCheckBox("Speculative decoding")
        self.spec_toggle.setChecked(APP_DEFAULTS.speculative)
        self.spec_toggle.setToolTip("Off: plain decoding, one target step per token")
        self.drafter_combo = QComboBox()
        self.drafter_combo.addItem("Draft model", "model")
        self.drafter_combo.addItem("N-gram (prompt lookup)", "ngram")
        self.drafter_combo.addItem("Draft model + n-gram", "hybrid")
        self.drafter_combo.setItemData(self.drafter_combo.findData("hybrid"), "The n-gram lookup when it is likely "
                                       "to pass (free drafts), else the draft model", Qt.ItemDataRole.ToolTipRole)
        self.drafter_combo.setCurrentIndex(self.drafter_combo.findData(APP_DEFAULTS.drafter))
        self.k_slider = _slider(K_MIN, APP_DEFAULTS.k_max, APP_DEFAULTS.k, 2)
        self.k_slider.setToolTip("Tokens drafted per round")
        self.k_label = QLabel()
        self.adaptive_check = QCheckBox("Adaptive K")
        self.adaptive_check.setChecked(APP_DEFAULTS.adaptive)
        self.adaptive_check.setToolTip("Let the engine pick K each round from recent acceptance; the K slider is "
                                       "the upper bound")
        form.addRow(self.spec_toggle)
        form.addRow("Drafter", self.drafter_combo)
        form.addRow("K", _with_value(self.k_slider, self.k_label))
        self.stop_check = QCheckBox("Stop drafting when unsure")
        self.stop_check.setChecked(APP_DEFAULTS.stop_below > 0)
        self.stop_check.setToolTip(
            f"The draft model ends a round's draft early once its own confidence that all its tokens pass drops "
            f"below {APP_DEFAULTS.stop_below:.0%}, so K is a ceiling: fewer wasted draft steps and verify rows. Output is "
            "unchanged either way")
        form.addRow(self.adaptive_check)
        form.addRow(self.stop_check)
        return box

    def _sampling_box(self) -> QGroupBox:
        box = QGroupBox("Sampling")
        form = QFormLayout(box)
        self.temp_slider = _slider(0, 200, round(APP_DEFAULTS.temperature * 100), 10)
        self.temp_slider.setToolTip("0 is greedy: the reply is then identical with and without speculation")
        self.temp_label = QLabel()
        self.top_p_slider = _slider(5, 100, round(APP_DEFAULTS.top_p * 100), 5)
        self.top_p_label = QLabel()
        self.top_k_spin = QSpinBox()
        self.top_k_spin.setRange(0, 1000)
        self.top_k_spin.setSpecialValueText("off")
        self.top_k_spin.setValue(APP_DEFAULTS.top_k)
        self.max_tokens_spin = QSpinBox()
        self.max_tokens_spin.setRange(1, 8192)
        self.max_tokens_spin.setValue(APP_DEFAULTS.max_new_tokens)
        self.max_tokens_spin.setSingleStep(128)
        self.max_tokens_spin.setSuffix(" tokens")
        self.max_tokens_spin.setToolTip("The most tokens a reply may have (max new tokens); a reply that reaches it "
                                        "stops mid-sentence. Fixed when a reply starts.")
        self.seed_spin = QSpinBox()
        self.seed_spin.setRange(SEED_RANDOM, 2**31 - 1)
        self.seed_spin.setValue(SEED_RANDOM if APP_DEFAULTS.seed is None else APP_DEFAULTS.seed)
        self.seed_spin.setSpecialValueText("random")
        self.seed_spin.setToolTip("Fixed when a reply starts; 'random' draws a new seed each time")
        form.addRow("Reply length", self.max_tokens_spin)  # first: the setting most often changed
        form.addRow("Temperature", _with_value(self.temp_slider, self.temp_label))
        form.addRow("Top-p", _with_value(self.top_p_slider, self.top_p_label))
        form.addRow("Top-k", self.top_k_spin)
        form.addRow("Seed", self.seed_spin)
        return box

    def _system_box(self) -> QGroupBox:
        box = QGroupBox("System prompt")
        lay = QVBoxLayout(box)
        self.system_edit = QPlainTextEdit()
        self.system_edit.setPlaceholderText("Optional; used from the next message on")
        self.system_edit.setMaximumHeight(72)
        self.system_edit.setTabChangesFocus(True)
        lay.addWidget(self.system_edit)
        return box

    def _connect(self) -> None:
        for sig in (self.k_slider.valueChanged, self.temp_slider.valueChanged, self.top_p_slider.valueChanged,
                    self.top_k_spin.valueChanged, self.spec_toggle.toggled, self.adaptive_check.toggled,
                    self.stop_check.toggled,
                    self.drafter_combo.currentIndexChanged):
            sig.connect(self._on_live_change)
        self.target_combo.currentIndexChanged.connect(self._refill_drafts)
        self.draft_combo.currentIndexChanged.connect(self._update_context)
        self.load_button.clicked.connect(self._request_load)
        self.rescan_button.clicked.connect(self.rescanRequested)

    # ---- values --------------------------------------------------------------------------------------------
    def sampling_params(self) -> SamplingParams:
        seed = self.seed_spin.value()
        return SamplingParams(
            temperature=self.temp_slider.value() / 100.0,
            top_p=self.top_p_slider.value() / 100.0,
            top_k=self.top_k_spin.value(),
            max_new_tokens=self.max_tokens_spin.value(),
            seed=None if seed == SEED_RANDOM else seed,
        )

    def spec_params(self) -> SpecParams:
        return SpecParams(
            enabled=self.spec_toggle.isChecked(),
            k=self.k_slider.value(),
            drafter=self.drafter_combo.currentData(),
            adaptive=self.adaptive_check.isChecked(),
            k_max=APP_DEFAULTS.k_max,
            stop_below=APP_DEFAULTS.stop_below if self.stop_check.isChecked() else 0.0,
        )

    def system_prompt(self) -> str:
        return self.system_edit.toPlainText().strip()

    def _on_live_change(self, *_: object) -> None:
        self.update_labels()
        self.changed.emit()

    def update_labels(self) -> None:
        self.k_label.setText(str(self.k_slider.value()))
        t = self.temp_slider.value() / 100.0
        self.temp_label.setText("0 (greedy)" if t == 0 else f"{t:.2f}")
        self.top_p_label.setText(f"{self.top_p_slider.value() / 100.0:.2f}")
        spec = self.spec_toggle.isChecked()
        self.drafter_combo.setEnabled(spec)
        self.k_slider.setEnabled(spec)
        self.adaptive_check.setEnabled(spec)
        self.stop_check.setEnabled(spec and self.drafter_combo.currentData() in NEEDS_DRAFT_MODEL)

    # ---- models --------------------------------------------------------------------------------------------
    def set_local_models(self, models: Sequence[Any]) -> None:
        """Fill the picker: the embedded pair first, then local models (objects with name, path, arch,
        vocab_size, params_b)."""
        keep = self.target_combo.currentData()
        self._models = list(models)
        self.target_combo.blockSignals(True)
        self.target_combo.clear()
        self.target_combo.addItem("Embedded pair (default)", None)
        for m in self._models:
            if runs_here(m):
                self.target_combo.addItem(describe_model(m), str(m.path))
                self.target_combo.setItemData(self.target_combo.count() - 1, str(m.path), Qt.ItemDataRole.ToolTipRole)
        for m in self._models:  # after the runnable ones, greyed out: found, but SpecLens says why it cannot run it
            if not runs_here(m):
                self.target_combo.addItem(f"{describe_model(m)}  \u00b7 cannot run: {m.why_not}", str(m.path))
                row = self.target_combo.count() - 1
                self.target_combo.setItemData(row, f"{m.path}\n{m.why_not}", Qt.ItemDataRole.ToolTipRole)
                self.target_combo.model().item(row).setEnabled(False)
        for path in self._unlisted():
            self._add_named(self.target_combo, path)
        i = self.target_combo.findData(keep)
        self.target_combo.setCurrentIndex(max(i, 0))
        self.target_combo.blockSignals(False)
        self._refill_drafts()
        self._update_context()

    def _refill_drafts(self, *_: object) -> None:
        keep = self.draft_combo.currentData()
        target = self.target_combo.currentData()
        self.draft_combo.clear()
        if target is None:
            self.draft_combo.addItem("Embedded draft", None)
            self.draft_combo.setEnabled(False)
            return
        self.draft_combo.setEnabled(True)
        self.draft_combo.addItem("None (n-gram drafter only)", None)
        tm = next((m for m in self._models if str(m.path) == target), None)
        for m in self._models:
            if runs_here(m) and str(m.path) != target and (tm is None or m.vocab_size == tm.vocab_size):
                self.draft_combo.addItem(describe_model(m), str(m.path))
        for path in self._unlisted():
            if path != target:
                self._add_named(self.draft_combo, path)
        self.draft_combo.setCurrentIndex(max(self.draft_combo.findData(keep), 0))
        self._update_context()

    def _update_context(self, *_: object) -> None:
        """The context setting follows the chosen pair: its limit, what its caches cost, and whether it is the
        loaded one."""
        self._show_in_use()
        target, draft = self.target_combo.currentData(), self.draft_combo.currentData()
        if target is None:  # the embedded pair: both of its models, as the scan described them
            self.context.set_pair([m for m in self._models if getattr(m, "source", "") == "embedded"] or [_UNKNOWN])
            return
        by_path = {str(m.path): m for m in self._models}
        self.context.set_pair([by_path.get(p, _UNKNOWN) for p in (target, draft) if p is not None])

    def _show_in_use(self) -> None:
        """The context note speaks of the loaded pair while the picker shows it."""
        shown = (self.target_combo.currentData(), self.draft_combo.currentData())
        if self.target_combo.currentData() is None:
            shown = (None, None)  # the embedded pair's draft is part of it
        loaded = self.loaded_pair
        self.context.set_in_use(self.loaded_context if loaded is not None and shown == loaded else None)

    def show_loaded(self, target: str | None, draft: str | None, context: int) -> None:
        """The engine loaded this pair: the picker shows it (also after a later load failed or a scan refilled
        the list), and the context note speaks of it."""
        self.loaded_pair = (target, None) if target is None else (target, draft)
        self.loaded_context = context
        self._named += [p for p in (target, draft) if p is not None and p not in self._named]
        self.set_local_models(self._models)
        self.select_pair(*self.loaded_pair)
        self._show_in_use()

    def show_current(self) -> None:
        """Back to what is loaded (after a load failed or was cancelled); the embedded pair before any load."""
        if self.loaded_pair is not None:
            self.select_pair(*self.loaded_pair)
        self._show_in_use()

    def context_tokens(self) -> int | None:
        """The context length the next load asks for; None: the default."""
        return self.context.tokens()

    def _unlisted(self) -> list[str]:
        listed = {str(m.path) for m in self._models}
        return [p for p in self._named if p not in listed]

    @staticmethod
    def _add_named(combo: QComboBox, path: str) -> None:
        combo.addItem(f"{Path(path).name or path}  \u00b7 named path", path)
        combo.setItemData(combo.count() - 1, path, Qt.ItemDataRole.ToolTipRole)

    def show_requested(self, target: str | None, draft: str | None) -> None:
        """Point the picker at the pair a load asks for, listed or not, so that it shows what was loaded (or
        refused: Load then retries it, or the user picks another)."""
        self._named += [p for p in (target, draft) if p is not None and p not in self._named]
        self.set_local_models(self._models)
        self.select_pair(target, draft)

    def _request_load(self) -> None:
        self.loadRequested.emit(self.target_combo.currentData(), self.draft_combo.currentData())

    def set_loading(self, loading: bool) -> None:
        self.load_button.setEnabled(not loading)
        self.rescan_button.setEnabled(not loading)

    def set_loaded(self, target: str, draft: str | None, device: str, dtype: str) -> None:
        pair = f"<b>{target}</b>" + (f" + draft <b>{draft}</b>" if draft else " (no draft model)")
        self.loaded_label.setText(f"{pair}<br>{device} \u00b7 {dtype}")
        for name in NEEDS_DRAFT_MODEL:
            self.drafter_combo.model().item(self.drafter_combo.findData(name)).setEnabled(draft is not None)
        if draft is None and self.drafter_combo.currentData() in NEEDS_DRAFT_MODEL:
            self.drafter_combo.setCurrentIndex(self.drafter_combo.findData("ngram"))

    # ---- persistence ---------------------------------------------------------------------------------------
    def save_settings(self, s: QSettings) -> None:
        s.beginGroup("controls")
        s.setValue("k", self.k_slider.value())
        s.setValue("temperature", self.temp_slider.value())
        s.setValue("top_p", self.top_p_slider.value())
        s.setValue("top_k", self.top_k_spin.value())
        s.setValue("max_new_tokens", self.max_tokens_spin.value())
        s.setValue("seed", self.seed_spin.value())
        s.setValue("speculative", self.spec_toggle.isChecked())
        s.setValue("drafter", self.drafter_combo.currentData())
        s.setValue("adaptive", self.adaptive_check.isChecked())
        s.setValue("stop_when_unsure", self.stop_check.isChecked())
        s.setValue("system_prompt", self.system_edit.toPlainText())
        s.setValue("target", self.target_combo.currentData() or "")
        s.setValue("draft", self.draft_combo.currentData() or "")
        s.setValue("context", self.context.wanted)
        s.endGroup()

    def load_settings(self, s: QSettings) -> None:
        s.beginGroup("controls")
        try:
            self.k_slider.setValue(int(s.value("k", self.k_slider.value())))
            self.temp_slider.setValue(int(s.value("temperature", self.temp_slider.value())))
            self.top_p_slider.setValue(int(s.value("top_p", self.top_p_slider.value())))
            self.top_k_spin.setValue(int(s.value("top_k", self.top_k_spin.value())))
            self.max_tokens_spin.setValue(int(s.value("max_new_tokens", self.max_tokens_spin.value())))
            self.seed_spin.setValue(int(s.value("seed", self.seed_spin.value())))
            self.spec_toggle.setChecked(_bool(s.value("speculative", APP_DEFAULTS.speculative)))
            i = self.drafter_combo.findData(s.value("drafter", APP_DEFAULTS.drafter))
            self.drafter_combo.setCurrentIndex(i if i >= 0 else self.drafter_combo.findData(APP_DEFAULTS.drafter))
            self.adaptive_check.setChecked(_bool(s.value("adaptive", APP_DEFAULTS.adaptive)))
            self.stop_check.setChecked(_bool(s.value("stop_when_unsure", APP_DEFAULTS.stop_below > 0)))
            self.system_edit.setPlainText(str(s.value("system_prompt", "")))
            self.saved_pair = (str(s.value("target", "")) or None, str(s.value("draft", "")) or None)
            self.context.set_wanted(int(s.value("context", self.context.wanted)))
        except (TypeError, ValueError):
            pass  # a hand-edited or stale settings file: keep the defaults
        finally:
            s.endGroup()
        self.update_labels()

    def select_pair(self, target: str | None, draft: str | None) -> None:
        """Point the picker at a pair (when it is listed)."""
        i = self.target_combo.findData(target)
        if i >= 0 and self.target_combo.model().item(i).isEnabled():  # a refused model is never chosen
            self.target_combo.setCurrentIndex(i)
            j = self.draft_combo.findData(draft)
            if j >= 0:
                self.draft_combo.setCurrentIndex(j)


_UNKNOWN = SimpleNamespace(context_limit=0, kv_values_per_token=0)  # a model no scan described (a named path)


def _bool(v: object) -> bool:
    return v in (True, "true", "True", "1", 1)
