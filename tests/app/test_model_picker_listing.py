"""The side panel's model picker: what a line says about a model, and a model SpecLens refuses listed greyed out
with its reason, never chosen."""
from app.views.controls_panel import ControlsPanel, describe_model


class M:
    def __init__(self, name, source, arch="qwen2", vocab=1000, params=0.49, quant="Q4_K_M", why_not=""):
        self.name, self.path, self.source, self.arch = name, f"/m/{name.replace('/', '_')}", source, arch
        self.vocab_size, self.params_b, self.quant, self.why_not = vocab, params, quant, why_not


def test_a_line_names_size_family_quantization_and_app():
    line = describe_model(M("publisher/repo/small-Q4_K_M.gguf", "lm-studio"))
    assert line.startswith("small-Q4_K_M.gguf ")  # the file, not publisher/repo/file
    assert "0.49B qwen2 Q4_K_M" in line and line.endswith("LM Studio")
    assert describe_model(M("qwen2.5-coder:0.5b", "ollama")).endswith("Ollama")
    assert " 2.1K " in describe_model(M("stub", "lm-studio", params=2.08e-6))  # not "0.00B"
    assert " 5M " in describe_model(M("stub", "lm-studio", params=0.005))


def test_a_refused_model_is_listed_greyed_with_its_reason(qtbot):
    why = "Gemma 2 needs logit soft-capping, which SpecLens does not implement yet"
    big = M("big", "hf-cache", params=1.5)
    small = M("small", "ollama")
    refused = M("gemma-2", "lm-studio", arch="gemma2", why_not=why)
    p = ControlsPanel()
    qtbot.addWidget(p)
    p.set_local_models([refused, big, small])
    combo = p.target_combo
    row = combo.findData(refused.path)
    assert row == combo.count() - 1  # after the runnable ones
    assert why in combo.itemText(row) and not combo.model().item(row).isEnabled()
    assert all(combo.model().item(i).isEnabled() for i in range(row))
    p.select_pair(refused.path, None)  # a saved choice naming it is not taken
    assert combo.currentData() is None
    p.select_pair(big.path, None)
    drafts = [p.draft_combo.itemData(i) for i in range(p.draft_combo.count())]
    assert drafts == [None, small.path]  # never offered as a draft
