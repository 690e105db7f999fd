"""Controls: live changes reach the engine at its next round; settings persist in an isolated QSettings."""
from PySide6.QtCore import QSettings

from app.views.controls_panel import ControlsPanel, describe_model
from engine.api.config import APP_DEFAULTS, STOP_BELOW, SamplingParams, SpecParams
from tests.app_fixtures import fake, wait_idle


def test_panel_values(qtbot):
    p = ControlsPanel()
    qtbot.addWidget(p)
    assert p.sampling_params() == SamplingParams(temperature=0.0, top_p=1.0, top_k=0, max_new_tokens=1024, seed=None)
    assert APP_DEFAULTS.drafter == "hybrid"  # fastest on Zen 4/5; on Zen 3 within the runs' spread (README)
    assert p.spec_params() == SpecParams(enabled=True, k=APP_DEFAULTS.k, drafter="hybrid", adaptive=False, k_max=16,
                                         stop_below=STOP_BELOW)
    p.stop_check.setChecked(False)
    assert p.spec_params().stop_below == 0.0  # always K
    p.k_slider.setValue(99)
    assert p.spec_params().k == 16  # the slider's range is 1..16
    p.k_slider.setValue(0)
    assert p.spec_params().k == 1
    p.temp_slider.setValue(135)
    p.top_p_slider.setValue(90)
    p.seed_spin.setValue(7)
    p.drafter_combo.setCurrentIndex(1)
    p.adaptive_check.setChecked(True)
    s = p.sampling_params()
    assert (s.temperature, s.top_p, s.seed) == (1.35, 0.9, 7)
    assert p.spec_params().drafter == "ngram" and p.spec_params().adaptive
    assert p.temp_label.text() == "1.35"
    p.temp_slider.setValue(0)
    assert p.temp_label.text() == "0 (greedy)" and p.sampling_params().greedy


def test_every_live_control_emits_changed(qtbot):
    p = ControlsPanel()
    qtbot.addWidget(p)
    for change in (lambda: p.k_slider.setValue(9), lambda: p.temp_slider.setValue(50),
                   lambda: p.top_p_slider.setValue(80), lambda: p.top_k_spin.setValue(40),
                   lambda: p.stop_check.setChecked(False), lambda: p.spec_toggle.setChecked(False),
                   lambda: p.adaptive_check.setChecked(True), lambda: p.drafter_combo.setCurrentIndex(1)):
        with qtbot.waitSignal(p.changed, timeout=1000):
            change()


def test_changes_reach_engine_at_next_round(qtbot, make_window, engine_log):
    w = make_window(fake(round_delay=0.03, log=str(engine_log.path)), show=False)
    w.input.setPlainText("go")
    w.send()
    record = w.controller.active.record
    qtbot.waitUntil(lambda: len(engine_log.seen) >= 3, timeout=5000)
    assert all(s.k == APP_DEFAULTS.k and s.enabled and s.temperature == 0.0 for s in engine_log.seen)
    n = len(engine_log.seen)  # rounds started so far; the next one may already have read the old values
    w.controls.k_slider.setValue(7)
    w.controls.temp_slider.setValue(80)
    w.controls.top_p_slider.setValue(90)
    w.controls.adaptive_check.setChecked(True)
    qtbot.waitUntil(lambda: len(engine_log.seen) >= n + 3, timeout=5000)
    m = len(engine_log.seen)
    w.controls.spec_toggle.setChecked(False)
    w.controls.drafter_combo.setCurrentIndex(1)
    wait_idle(qtbot, w)
    seen = engine_log.seen
    later = seen[n + 1:]
    assert later and all((s.k, s.temperature, s.top_p, s.adaptive) == (7, 0.8, 0.9, True) for s in later)
    off = seen[m + 1:]
    assert off and all(not s.enabled and s.drafter == "ngram" for s in off)
    # ... and the engine really ran plain rounds from then on.
    assert all(r.mode == "plain" for r in record.rounds[m + 1:])
    assert any(r.mode == "speculative" and r.temperature == 0.8 for r in record.rounds)


def test_no_draft_model_switches_to_ngram(qtbot):
    p = ControlsPanel()
    qtbot.addWidget(p)
    p.set_loaded("t", None, "cpu", "float32")
    assert p.spec_params().drafter == "ngram"
    assert not p.drafter_combo.model().item(0).isEnabled()
    p.set_loaded("t", "d", "cpu", "float32")
    assert p.drafter_combo.model().item(0).isEnabled()
    assert "no draft model" not in p.loaded_label.text()


def test_hybrid_drafter_choice(qtbot):
    """"Draft model + n-gram" needs the draft model; the stop rule applies to its model rounds."""
    p = ControlsPanel()
    qtbot.addWidget(p)
    p.set_loaded("t", "d", "cpu", "float32")
    p.drafter_combo.setCurrentIndex(p.drafter_combo.findData("hybrid"))
    assert p.spec_params().drafter == "hybrid"
    assert p.stop_check.isEnabled()
    p.set_loaded("t", None, "cpu", "float32")
    assert p.spec_params().drafter == "ngram"
    assert not p.drafter_combo.model().item(p.drafter_combo.findData("hybrid")).isEnabled()
    assert not p.stop_check.isEnabled()


def test_model_picker_lists_embedded_and_compatible(qtbot):
    class M:
        def __init__(self, name, vocab, params):
            self.name, self.path, self.arch, self.vocab_size, self.params_b = name, f"/m/{name}", "llama", vocab, params
            self.source = "hf-cache"

    p = ControlsPanel()
    qtbot.addWidget(p)
    models = [M("big", 1000, 3.2), M("small", 1000, 1.2), M("other", 2000, 0.5)]
    p.set_local_models(models)
    assert p.target_combo.itemText(0).startswith("Embedded pair")
    assert p.target_combo.count() == 4 and describe_model(models[0]) in p.target_combo.itemText(1)
    assert not p.draft_combo.isEnabled()  # the embedded pair brings its own draft
    p.target_combo.setCurrentIndex(1)
    drafts = [p.draft_combo.itemData(i) for i in range(p.draft_combo.count())]
    assert drafts == [None, "/m/small"]  # same vocabulary only
    p.draft_combo.setCurrentIndex(1)
    with qtbot.waitSignal(p.loadRequested) as sig:
        p.load_button.click()
    assert sig.args == ["/m/big", "/m/small"]


def test_settings_persist(qtbot, tmp_path):
    path = str(tmp_path / "persist.ini")
    p = ControlsPanel()
    qtbot.addWidget(p)
    p.k_slider.setValue(11)
    p.temp_slider.setValue(70)
    p.top_k_spin.setValue(50)
    p.max_tokens_spin.setValue(640)
    p.seed_spin.setValue(1234)
    p.spec_toggle.setChecked(False)
    p.drafter_combo.setCurrentIndex(1)
    p.adaptive_check.setChecked(True)
    p.stop_check.setChecked(False)
    p.system_edit.setPlainText("Be brief.")
    p.save_settings(QSettings(path, QSettings.Format.IniFormat))
    q = ControlsPanel()
    qtbot.addWidget(q)
    q.load_settings(QSettings(path, QSettings.Format.IniFormat))
    assert q.sampling_params() == p.sampling_params() and q.spec_params() == p.spec_params()
    assert q.system_prompt() == "Be brief."


def test_window_settings_round_trip(qtbot, make_host, make_window):
    host = make_host()
    w = make_window(host=host, show=False)
    w.controls.k_slider.setValue(6)
    w.rejected_action.setChecked(False)
    w.set_theme("dark")
    w.close()  # saves
    w2 = make_window(host=host, show=False)
    assert w2.controls.k_slider.value() == 6
    assert not w2.rejected_action.isChecked() and not w2.chat.show_rejected
    assert w2.theme == "dark" and w2.theme_actions["dark"].isChecked()
    w2.set_theme("light")


def test_bad_settings_fall_back_to_defaults(qtbot, qt_settings):
    qt_settings.setValue("controls/k", "not a number")
    p = ControlsPanel()
    qtbot.addWidget(p)
    p.load_settings(qt_settings)
    assert p.spec_params().k == APP_DEFAULTS.k


def test_an_unknown_drafter_in_the_settings_falls_back_to_the_default(qtbot, qt_settings):
    qt_settings.setValue("controls/drafter", "medusa")  # a hand-edited file, or a drafter a later version dropped
    p = ControlsPanel()
    qtbot.addWidget(p)
    p.drafter_combo.setCurrentIndex(p.drafter_combo.findData("ngram"))
    p.load_settings(qt_settings)
    assert p.spec_params().drafter == APP_DEFAULTS.drafter


def test_the_context_setting_follows_the_pair_and_shows_its_memory(qtbot):
    """The context was fixed at 4096 though the embedded target allows 32k."""
    from pathlib import Path

    from engine.io.hub import LocalModel

    p = ControlsPanel()
    qtbot.addWidget(p)
    target = LocalModel("qwen-1.5b", Path("/c/t.gguf"), "embedded", "qwen2", 151936, 28, 1536, 1.54, 32768,
                        2 * 28 * 2 * 128, 2)
    draft = LocalModel("qwen-0.5b", Path("/c/d.gguf"), "embedded", "qwen2", 151936, 24, 896, 0.49, 32768,
                       2 * 24 * 2 * 64, 2)
    short = LocalModel("other", Path("/m/short"), "hf-cache", "llama", 32000, 16, 2048, 1.1, 2048, 2 * 16 * 8 * 64)
    p.set_local_models([target, draft, short])
    c = p.context
    assert c.spin.value() == 4096 and p.context_tokens() is None  # the default: the engine picks it
    assert c.spin.maximum() == 32768 and "32,768" in c.note.text()
    per_token = (2 * 28 * 2 * 128 + 2 * 24 * 2 * 64) * 2  # float16 K and V of both models (GGUF models' caches)
    assert f"{per_token * 4096 / 1e9:.2f} GB" in c.note.text() and "next Load" in c.note.text()
    c.spin.setValue(16384)
    assert p.context_tokens() == 16384 and f"{per_token * 16384 / 1e9:.2f} GB" in c.note.text()
    p.target_combo.setCurrentIndex(p.target_combo.findData("/m/short"))
    assert c.spin.maximum() == 2048 and c.spin.value() == 2048  # this pair's limit ...
    p.target_combo.setCurrentIndex(0)
    assert c.spin.value() == 16384  # ... and the choice comes back with the pair that allows it
