"""Run › Tune K on the tiny real engine: the sweep equals separate benchmark runs, it can be cancelled, its best
K goes to the K slider in one click, and the CSV export includes it."""
import csv

import pytest

from app.session.tuner import KIND
from engine.analysis.stats import tuner_path
from engine.analysis.sweep import plan
from engine.tools.bench import run_mode
from tests.app_fixtures import fake, tiny, wait_idle
from tests.tiny import tiny_engine


def chat_once(qtbot, w, max_tokens=12):
    w.controls.seed_spin.setValue(21)
    w.controls.temp_slider.setValue(80)
    w.controls.max_tokens_spin.setValue(max_tokens)
    w.controls.k_slider.setValue(5)
    w.input.setPlainText("Tell me about the sea.")
    w.send()
    wait_idle(qtbot, w, timeout=20000)


def test_sweep_equals_separate_bench_runs(qtbot, make_window, tmp_path):
    w = make_window(tiny(draft_name="tiny-draft"))
    chat_once(qtbot, w)
    assert w.tune_action.isEnabled()
    dlg = w.tune_k()
    assert dlg is not None and not w.send_button.isEnabled()  # the replays hold the engine
    qtbot.waitUntil(lambda: dlg.tuner.done, timeout=120000)
    assert dlg.complete and dlg.tuner.error is None
    sweep = dlg.sweep
    assert [(r.drafter, r.k) for r in sweep.runs] == plan(True)
    # The same replays, one bench run each, in this process on the same tiny pair.
    engine = tiny_engine()
    engine.eos_ids = set()  # as the engine process's tiny loader
    ids = engine.encode_chat(dlg.tuner.messages)
    for r in sweep.runs:
        mode = "plain" if r.drafter is None else "draft" if r.drafter == "model" else "ngram"
        bench = run_mode(engine, [ids], mode, max(r.k, 1), dlg.tuner.sampling)
        assert (r.accepted, r.new_tokens, r.rounds) == (round(bench.acceptance_rate * r.drafted), bench.new_tokens,
                                                         bench.rounds), r.label
        assert [list(r.token_ids)] == bench.outputs, r.label
    # The dialog: measured points for both drafters, Leviathan's curve, the best marked.
    assert len(dlg.curves["model"].xData) == 8 and len(dlg.curves["ngram"].xData) == 8
    assert len(dlg.curves["leviathan"].xData) == 8
    best = sweep.best
    assert best is not None and f"K={best.k}" in dlg.best_label.toPlainText()
    assert "\u03b1" in dlg.result.text()
    # Replays are in the session stats, and the sweep in the CSV export.
    stats = w.controller.stats
    assert [r.kind for r in stats.records].count(KIND) == len(sweep.runs) and stats.sweeps == [sweep]
    assert w.export_stats(str(tmp_path / "s.csv"))
    with tuner_path(tmp_path / "s.csv").open(encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == len(sweep.runs) and sum(int(r["best"]) for r in rows) == 1
    # One rate: the tuner's CSV, the session's summary CSV and the dialog agree on each replay's
    with (tmp_path / "s_summary.csv").open(encoding="utf-8") as f:
        summaries = {int(r["message"]): float(r["tokens_per_s"]) for r in csv.DictReader(f) if r["kind"] == KIND}
    for row, r in zip(rows, sweep.runs):
        assert float(row["tokens_per_s"]) == pytest.approx(summaries[r.message], abs=0.01) == r.tokens_per_s
    assert "less both prompt prefills" in dlg.findChild(type(dlg.status), "intro").text()
    assert [int(r["accepted"]) for r in rows] == [r.accepted for r in sweep.runs]
    # One click applies the best K.
    w.controls.k_slider.setValue(1)
    dlg.apply_button.click()
    assert w.controls.k_slider.value() == best.k
    assert w.controls.drafter_combo.currentData() == best.drafter and not w.controls.adaptive_check.isChecked()
    assert not w.controls.stop_check.isChecked()  # what runs now is what the sweep measured
    assert w.controls.spec_params().k == best.k
    dlg.close()
    qtbot.waitUntil(lambda: w.send_button.isEnabled(), timeout=5000)


def test_cancel_stops_the_sweep(qtbot, make_window):
    w = make_window(tiny(round_delay=0.02, draft_name="tiny-draft"))
    chat_once(qtbot, w, max_tokens=30)
    dlg = w.tune_k()
    qtbot.waitUntil(lambda: len(dlg.tuner.runs) >= 1, timeout=30000)
    assert 0 < dlg.progress.value() < 1000 and "Replay" in dlg.status.text()
    dlg.cancel_button.click()
    # Nothing changed for ~25 s while the running replay's prefill went on
    assert dlg.tuner.done or ("Cancelling" in dlg.status.text() and not dlg.cancel_button.isEnabled())
    qtbot.waitUntil(lambda: dlg.tuner.done, timeout=10000)
    wait_idle(qtbot, w)
    assert not dlg.complete and len(dlg.sweep.runs) < len(dlg.tuner.plan)
    assert "Cancelled" in dlg.status.text() and not dlg.cancel_button.isEnabled()
    stats = w.controller.stats
    n = len(stats.records)
    qtbot.wait(300)
    assert len(stats.records) == n and not w.controller.busy  # nothing more was submitted
    assert stats.sweeps == []  # an incomplete sweep is not exported
    assert w.send_button.isEnabled()


def test_tune_needs_a_prompt(window):
    assert not window.tune_action.isEnabled()
    assert window.tune_k() is None
    assert "Send a message first" in window.statusBar().currentMessage()


def test_tuner_without_a_draft_model_sweeps_the_ngram_drafter(qtbot, make_window):
    w = make_window(fake(draft_name=None))
    w.controls.max_tokens_spin.setValue(16)
    w.input.setPlainText("Write fib")
    w.send()
    wait_idle(qtbot, w)
    dlg = w.tune_k()
    qtbot.waitUntil(lambda: dlg.tuner.done, timeout=30000)
    assert [d for d, _ in dlg.tuner.plan] == [None] + ["ngram"] * 8
    assert dlg.complete and dlg.sweep.alpha is None  # no draft model: no Leviathan curve
    assert dlg.curves["leviathan"].xData is None or len(dlg.curves["leviathan"].xData) == 0
    dlg.close()


def test_a_failed_replay_stops_the_sweep_with_its_reason(qtbot, make_window, dialogs):
    w = make_window(fake(fail_at_round=2, fail_requests=None))  # every request fails in its second round
    w.controls.max_tokens_spin.setValue(20)
    w.input.setPlainText("Hi")
    w.send()
    wait_idle(qtbot, w)
    dlg = w.tune_k()
    qtbot.waitUntil(lambda: dlg.tuner.done, timeout=30000)
    assert not dlg.complete and "scripted engine failure" in dlg.status.text()
    assert len(dlg.sweep.runs) == 0 and w.controller.stats.sweeps == []
    dlg.close()


@pytest.mark.parametrize("seedless", [True])
def test_tuner_requires_a_seed(seedless, qtbot):
    from app.session.tuner import KTuner
    from engine.api.config import SamplingParams, SpecParams

    class Dummy:
        pass

    with pytest.raises(ValueError, match="seed"):
        KTuner(Dummy(), [], SamplingParams(), SpecParams(), True)


def test_apply_from_one_replay_each_says_it_is_one_sample(qtbot):
    """Apply was offered from single replays whose timing spread nobody knew."""
    from app.dialogs.tuner_dialog import TunerDialog
    from engine.analysis.sweep import Sweep, SweepRun
    from engine.api.config import SamplingParams, SpecParams

    def run(drafter, k, accepted, decode_s):
        drafted = 20 if drafter else 0
        return SweepRun(drafter, k, 40, 20, drafted, accepted, max(accepted, drafted), decode_s, 10.0, 3000.0,
                        "length")

    dlg = TunerDialog(None, [{"role": "user", "content": "q"}], SamplingParams(seed=3), SpecParams(), True)
    qtbot.addWidget(dlg)
    dlg._on_finished(Sweep((run(None, 0, 0, 4.0), run("model", 1, 15, 3.0), run("model", 2, 12, 2.5))), True)
    assert dlg.apply_button.isEnabled() and "one replay" in dlg.apply_button.text()
    assert "timing spread is unknown" in dlg.result.text()
    spread = Sweep((run(None, 0, 0, 4.0), run("model", 1, 15, 3.0), run("model", 2, 0, 4.1)))  # accepted nothing
    dlg._on_finished(spread, True)
    assert "one replay" not in dlg.apply_button.text() and "timing spread is unknown" not in dlg.result.text()
