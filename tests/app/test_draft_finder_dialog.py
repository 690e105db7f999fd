"""Model › Find a draft (app/dialogs/draft_finder.py), offscreen: the finder runs in its own process and the dialog
shows its progress, cancels it, fills the table from its result, and loads the chosen pair. A scripted finder
(below, run in the child) stands in for the measuring, and one run uses the real finder on tiny models."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from engine.service.loaders import Factory
from engine.tools import draft_candidates as dc
from engine.tools import draft_finder as df

SCRIPTED = "tests.app.test_draft_finder_dialog:scripted_finder"
TIMEOUT_MS = 60_000


def scripted_result(target: str | None, cancelled: bool) -> dict:
    """A finder's JSON, built from the engine's own dataclasses: two drafts measured (unsorted on purpose: the
    finder sorts them) unless cancelled, one model turned down."""
    cfg = df.FinderConfig(max_new_tokens=8, ks=(1, 2))
    small = dc.Candidate("small-draft", "/models/small.gguf", "lm-studio", "qwen2", 0.5, "Q4_K_M")
    measured = [] if cancelled else [
        df.Measured(dc.NGRAM_CANDIDATE, 1.12, 4, 0.5, 0.01, 1.6, 1.9, 33.6, 30.0, {1: 1.05, 4: 1.12}, True),
        df.Measured(small, 1.47, 2, 0.8, 0.1, 2.4, 2.03, 44.1, 30.0, {1: 1.3, 2: 1.47}, True),
    ]
    measured.sort(key=lambda m: m.speedup, reverse=True)
    big = dc.Candidate("huge", "/models/huge.gguf", "ollama", "qwen2", 32.0)
    rejected = [dc.Rejected(big, "not smaller than the target (32B against 1.5B): a draft pays only when its steps "
                                 "are cheap")]
    not_measured = [dc.Rejected(small, "cancelled before it was measured")] if cancelled else []
    tgt = dc.Candidate("the-target", target or "/models/target.gguf", "embedded", "qwen2", 1.5)
    return df.FinderResult(tgt, cfg, 3, measured, rejected, not_measured, cancelled=cancelled,
                           elapsed_s=1.0).to_json()


def scripted_finder(*, progress, cancelled, target=None, prompts=None, max_new_tokens=0, time_budget_s=0.0,
                    steps: int = 3, hold: bool = False, fail: str | None = None, seen: str | None = None) -> dict:
    """Runs in the finder's process. `hold`: report progress until cancelled (at most 20 s); `fail`: raise that;
    `seen`: write the arguments it was given there."""
    if seen:
        Path(seen).write_text(repr((target, prompts, max_new_tokens, time_budget_s)))
    for i in range(steps):
        progress(f"step {i}", i / steps)
        time.sleep(0.05)
    end = time.monotonic() + 20
    while hold and not cancelled() and time.monotonic() < end:
        progress("measuring", 0.5)
        time.sleep(0.05)
    if fail:
        raise df.ModelLoadError(fail)
    return scripted_result(target, cancelled())


def scripted(**kw) -> Factory:
    return Factory(SCRIPTED, kw)


@pytest.fixture
def open_dialog(qtbot):
    from app.dialogs.draft_finder import DraftFinderDialog

    dialogs = []

    def make(finder: Factory, target="/models/target.gguf", prompts=None, **kw):
        dlg = DraftFinderDialog(target, "the-target", prompts, finder=finder, **kw)
        qtbot.addWidget(dlg)
        dialogs.append(dlg)
        dlg.show()
        dlg.start()
        return dlg

    yield make
    for d in dialogs:
        d.close()


def test_progress_then_the_table_fills_and_the_chosen_pair_loads(qtbot, open_dialog, tmp_path):
    seen = tmp_path / "seen.txt"
    prompts = [[{"role": "user", "content": "hi"}]]
    dlg = open_dialog(scripted(steps=4, seen=str(seen)), prompts=prompts, max_new_tokens=16, time_budget_s=30)
    progress = []
    dlg.worker.progressed.connect(lambda stage, f: progress.append((stage, f)))
    qtbot.waitUntil(lambda: dlg.result is not None, timeout=TIMEOUT_MS)
    assert [s for s, _ in progress][:2] == ["step 0", "step 1"] and dlg.progress.value() == 1000
    assert eval(seen.read_text()) == ("/models/target.gguf", prompts, 16, 30)  # what the child was given
    # Measured rows, fastest first, with their figures; the turned-down model with its reason
    rows = [[dlg.table.item(r, c).text() for c in range(dlg.table.columnCount())] for r in range(dlg.table.rowCount())]
    assert [r[:7] for r in rows] == [["small-draft", "1.47\u00d7", "2.03\u00d7", "2", "0.80", "0.100", "2.40"],
                                     [dc.NGRAM, "1.12\u00d7", "1.90\u00d7", "4", "0.50", "0.010", "1.60"]]
    assert dlg.rejected.rowCount() == 1 and dlg.rejected.item(0, 1).text().startswith("not smaller than the target")
    assert "Fastest here: small-draft at K=2" in dlg.status.text() and not dlg.cancel_button.isEnabled()
    # The first row is selected: one click loads it and sets its K
    loads, applies = [], []
    dlg.loadRequested.connect(lambda t, d: loads.append((t, d)))
    dlg.applyRequested.connect(lambda d, k: applies.append((d, k)))
    assert dlg.load_button.isEnabled() and dlg.load_button.text() == "Load this pair (K=2)"
    dlg.load_button.click()
    assert loads == [("/models/target.gguf", "/models/small.gguf")] and applies == [("model", 2)]
    dlg.table.selectRow(1)  # the n-gram drafter: the target alone
    assert dlg.load_button.text() == "Load the target alone (n-gram, K=4)"
    dlg.load_button.click()
    assert loads[-1] == ("/models/target.gguf", None) and applies[-1] == ("ngram", 4)


def test_cancel_stops_the_finder_and_says_so(qtbot, open_dialog):
    dlg = open_dialog(scripted(hold=True))
    qtbot.waitUntil(lambda: dlg.status.text() == "measuring", timeout=TIMEOUT_MS)
    assert dlg.running and dlg.cancel_button.isEnabled()
    dlg.cancel_button.click()
    assert not dlg.cancel_button.isEnabled() and "Cancelling" in dlg.status.text()
    qtbot.waitUntil(lambda: dlg.result is not None, timeout=10_000)  # well before the script's own 20 s
    assert dlg.result["cancelled"] and dlg.status.text().startswith("Cancelled")
    assert dlg.table.rowCount() == 0 and not dlg.load_button.isEnabled()
    reasons = [dlg.rejected.item(r, 1).text() for r in range(dlg.rejected.rowCount())]
    assert "cancelled before it was measured" in reasons
    dlg.worker.process.join(5)
    assert dlg.worker.process.exitcode == 0


def test_a_failing_finder_is_told_in_one_line(qtbot, open_dialog):
    dlg = open_dialog(scripted(fail="the target cannot run here: no such family"))
    qtbot.waitUntil(lambda: dlg.error is not None, timeout=TIMEOUT_MS)
    assert dlg.status.text() == "Stopped: the target cannot run here: no such family"
    assert dlg.result is None and not dlg.cancel_button.isEnabled() and not dlg.load_button.isEnabled()


def test_closing_the_dialog_ends_the_finder(qtbot, open_dialog):
    dlg = open_dialog(scripted(hold=True))
    qtbot.waitUntil(lambda: dlg.status.text() == "measuring", timeout=TIMEOUT_MS)
    proc = dlg.worker.process
    t0 = time.monotonic()
    dlg.close()
    assert time.monotonic() - t0 < 0.5  # the window never waits on the finder
    qtbot.waitUntil(lambda: proc.exitcode is not None, timeout=10_000)  # the cancel ends it, well before its 20 s


def test_the_model_menu_opens_it_for_the_loaded_target(qtbot, window, monkeypatch):
    import app.dialogs.draft_finder as module

    monkeypatch.setattr(module, "FINDER_FOR_WINDOW", scripted())
    model_menu = window.menuBar().actions()[1]
    assert model_menu.text() == "&Model" and window.menus.find_draft_action in model_menu.menu().actions()
    window.menus.find_draft_action.trigger()
    dlg = window.draft_finder_dialog
    qtbot.waitUntil(lambda: dlg.result is not None, timeout=TIMEOUT_MS)
    assert dlg.table.rowCount() == 2
    loads = []
    monkeypatch.setattr(window, "load_models", lambda t, d=None, device=None: loads.append((t, d)))
    dlg.load_button.click()
    assert loads == [("/models/target.gguf", "/models/small.gguf")]  # no target named: the embedded one's path
    assert window.controls.k_slider.value() == 2


def test_the_real_finder_on_tiny_models(qtbot, open_dialog, tmp_path):
    from tests.engine.test_weights import make_hf_model, make_tokenizer

    tok = make_tokenizer()
    for name, layers in (("target", 3), ("draft", 1)):
        model = make_hf_model("llama", len(tok), num_hidden_layers=layers)
        model.save_pretrained(tmp_path / name)
        tok.save_pretrained(tmp_path / name)
    finder = Factory("engine.tools.draft_finder:find_drafts_json", {"candidates": [str(tmp_path / "draft")],
                                                                     "ks": (1,)})
    dlg = open_dialog(finder, target=str(tmp_path / "target"), prompts=[[{"role": "user", "content": "hi"}]],
                      max_new_tokens=4, time_budget_s=120)
    qtbot.waitUntil(lambda: dlg.result is not None or dlg.error is not None, timeout=120_000)
    assert dlg.error is None
    names = sorted(dlg.table.item(r, 0).text() for r in range(dlg.table.rowCount()))
    assert names == sorted(["draft", dc.NGRAM])
    assert all(m["identical_to_plain"] for m in dlg.result["measured"])
