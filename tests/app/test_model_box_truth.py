"""The Model box says what is loaded: after a failed load the Target box showed the failed path, after a rescan it
said "Embedded pair (default)" while another pair was loaded, and "KV cache size unknown" stayed after a load."""
from tests.app_fixtures import fake


def wait_loaded(qtbot, w) -> None:
    qtbot.waitUntil(lambda: not w.controller.loading and w.load_dialog is None, timeout=20000)


def test_the_target_box_shows_the_loaded_pair_after_a_failed_load(qtbot, make_window, dialogs):
    w = make_window(fake(), load=False, show=False)
    box = w.controls
    w.load_models(None)
    wait_loaded(qtbot, w)
    assert w.controller.ready and box.target_combo.currentData() is None
    assert box.context.note.text().startswith("Loaded") and "unknown" not in box.context.note.text()
    w.load_models("/nowhere/broken.gguf")
    wait_loaded(qtbot, w)
    assert dialogs and dialogs[-1][1] == "Could not load the model"
    assert box.target_combo.currentData() is None, box.target_combo.currentText()  # the loaded pair, not the failed
    assert box.target_combo.findData("/nowhere/broken.gguf") >= 0  # still listed: one pick away from a retry
    assert box.context.note.text().startswith("Loaded")
    box.target_combo.setCurrentIndex(box.target_combo.findData("/nowhere/broken.gguf"))
    assert "KV cache size unknown for this pair" in box.context.note.text()  # not loaded: nothing known of it
    w.model_loading.on_models([])  # a rescan refills the list
    assert box.target_combo.currentData() is None and box.context.note.text().startswith("Loaded")


def test_a_named_pair_stays_shown_after_a_rescan(qtbot, make_window, dialogs, tmp_path):
    path = str(tmp_path / "model.gguf")
    w = make_window(fake(expect=(path, None, None)), load=False, show=False)
    w.controls.saved_pair = (None, None)  # last session's choice: the embedded pair
    w.load_models(path, None)
    wait_loaded(qtbot, w)
    assert not dialogs and w.controls.target_combo.currentData() == path
    w.model_loading.on_models([])
    assert w.controls.target_combo.currentData() == path, w.controls.target_combo.currentText()
    assert w.controls.context.note.text().startswith("Loaded")


def test_the_reply_length_is_first_in_the_sampling_box_and_fits_a_coding_answer(qtbot):
    from app.views.controls_panel import ControlsPanel
    from engine.api.config import APP_DEFAULTS

    p = ControlsPanel()
    qtbot.addWidget(p)
    assert APP_DEFAULTS.max_new_tokens >= 1024 and p.max_tokens_spin.value() == APP_DEFAULTS.max_new_tokens
    form = p.max_tokens_spin.parentWidget().layout()
    assert form.labelForField(p.max_tokens_spin).text() == "Reply length"
    assert form.itemAt(0, form.ItemRole.FieldRole).widget() is p.max_tokens_spin
