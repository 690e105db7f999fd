"""Find a draft's tables as the screenshot showed them: names short enough that the reasons stay in view, the
reasons wrapped in their column, and a label that does not call a model left unmeasured "not a draft"."""
from engine.tools import draft_candidates as dc
from engine.tools import draft_finder as df
from tests.app.test_draft_finder_dialog import scripted

LONG = "lmstudio-community/Qwen2.5-Coder-0.5B-Instruct-GGUF/Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf"


def result(rejected: bool, not_measured: bool) -> dict:
    cfg = df.FinderConfig(max_new_tokens=8, ks=(2,))
    lms = dc.Candidate(LONG, "/lms/" + LONG, "lm-studio", "qwen2", 0.49, "Q4_K_M")
    ollama = dc.Candidate("qwen2.5-coder:0.5b", "/ollama/blobs/sha256-x", "ollama", "qwen2", 0.49, "Q4_K_M")
    gemma = dc.Candidate("lmstudio-community/gemma-3-270m-GGUF/gemma-3-270m-Q4_K_M.gguf", "/lms/g.gguf", "lm-studio",
                         "gemma3", 0.27)
    measured = [df.Measured(lms, 1.3, 2, 0.7, 0.2, 2.1, 1.5, 20.0, 15.0, {2: 1.3}, True)]
    turned = [dc.Rejected(gemma, "a different vocabulary size (262144 tokens, the target 151936): SpecLens pairs "
                                 "models whose vocabularies match in size and in every token")] if rejected else []
    left = [dc.Rejected(ollama, "the time budget (60 s) ran out before it was measured")] if not_measured else []
    tgt = dc.Candidate("the-target", "/models/target.gguf", "embedded", "qwen2", 1.5)
    return df.FinderResult(tgt, cfg, 1, measured, turned, left, out_of_time=not_measured).to_json()


def test_names_sources_and_wrapped_reasons(qtbot):
    from app.dialogs.draft_finder import DraftFinderDialog

    dlg = DraftFinderDialog(None, "the-target", finder=scripted())
    qtbot.addWidget(dlg)
    dlg.resize(1000, 600)
    dlg.show()
    dlg.fill(result(True, True))
    assert dlg.table.item(0, 0).text() == "Qwen2.5-Coder-0.5B-Instruct-Q4_K_M.gguf"
    assert dlg.table.item(0, 0).toolTip() == "/lms/" + LONG  # the whole path stays at hand
    assert dlg.table.item(0, dlg.table.columnCount() - 1).text() == "LM Studio"
    assert [dlg.rejected.item(r, 0).text() for r in range(2)] == ["gemma-3-270m-Q4_K_M.gguf", "qwen2.5-coder:0.5b"]
    assert dlg.rejected.item(1, 3).text() == "Ollama"
    assert dlg.rejected_label.text() == "Not a draft for this target, or not measured:"
    qtbot.wait(50)
    # the reason column ends inside the table's width, and a long reason takes more than one line
    header = dlg.rejected.horizontalHeader()
    assert header.sectionPosition(3) + header.sectionSize(3) <= dlg.rejected.viewport().width()
    assert dlg.rejected.rowHeight(0) > dlg.rejected.rowHeight(1)


def test_the_label_names_what_the_rows_are(qtbot):
    from app.dialogs.draft_finder import DraftFinderDialog

    dlg = DraftFinderDialog(None, "the-target", finder=scripted())
    qtbot.addWidget(dlg)
    dlg.fill(result(False, True))
    assert dlg.rejected_label.text() == "Not measured:"
    dlg.fill(result(True, False))
    assert dlg.rejected_label.text() == "Not a draft for this target:"


def test_copies_are_listed_and_a_near_tie_offers_the_bench_command(qtbot):
    from PySide6.QtGui import QGuiApplication

    from app.dialogs.draft_finder import DraftFinderDialog

    cfg = df.FinderConfig(max_new_tokens=8, ks=(2,))
    lms = dc.Candidate(LONG, "/lms/" + LONG, "lm-studio", "qwen2", 0.49, "Q4_K_M")
    ollama = dc.Candidate("qwen2.5-coder:0.5b", "/ollama/blobs/sha256-x", "ollama", "qwen2", 0.49, "Q4_K_M")
    measured = [df.Measured(lms, 1.3, 2, 0.7, 0.2, 2.1, 1.5, 20.0, 15.0, {2: 1.3}, True),
                df.Measured(dc.NGRAM_CANDIDATE, 1.2, 2, 0.5, 0.01, 1.6, 1.4, 18.0, 15.0, {2: 1.2}, True)]
    tgt = dc.Candidate("the-target", "/models/target.gguf", "embedded", "qwen2", 1.5)
    data = df.FinderResult(tgt, cfg, 1, measured, copies=[dc.Copy(ollama, lms)], elapsed_s=3.0).to_json()
    dlg = DraftFinderDialog(None, "the-target", finder=scripted())
    qtbot.addWidget(dlg)
    assert dlg.copy_button.isHidden()
    dlg._on_finished(data)
    assert dlg.rejected_label.text() == "Not measured:"
    assert dlg.rejected.item(0, 0).text() == "qwen2.5-coder:0.5b"
    assert dlg.rejected.item(0, 1).text() == f"the same file as {LONG} (LM Studio): measured once, under that name"
    assert "n-gram (prompt lookup) (1.20\u00d7) is within the finder's noise" in dlg.status.text()
    assert not dlg.copy_button.isHidden()
    dlg.copy_button.click()
    assert QGuiApplication.clipboard().text() == df.near_tie_advice(data) == dlg.status.toolTip()
    assert "--modes plain,draft,ngram" in dlg.advice

    clear = df.FinderResult(tgt, cfg, 1, measured[:1], elapsed_s=3.0).to_json()
    other = DraftFinderDialog(None, "the-target", finder=scripted())
    qtbot.addWidget(other)
    other._on_finished(clear)
    assert other.copy_button.isHidden() and "noise" not in other.status.text()
