"""load_engine from a Hugging Face folder, pair checks, and the speclens-bench contract."""
import json

import pytest
import torch

from engine.api.config import SamplingParams, SpecParams
from engine.io.loading import load_engine
from engine.io.weights import ModelLoadError
from engine.tools.bench import main as bench_main
from tests.tiny import ENGINE_CFG, hf_model, pair_folders, save_folder, tiny_tokenizer


@pytest.fixture(scope="module")
def pair_dirs(tmp_path_factory):
    return pair_folders(tmp_path_factory.mktemp("pair"))


def test_load_folder_pair_and_generate(pair_dirs):
    t, d = pair_dirs
    eng = load_engine(str(t), str(d), device="cpu")
    assert eng.device.type == "cpu" and eng.dtype == torch.float32
    prompt = eng.encode_chat([{"role": "user", "content": "hello"}])
    *_, plain = eng.generate(prompt, SamplingParams(max_new_tokens=20), SpecParams(enabled=False))
    eng.reset()
    *_, spec = eng.generate(prompt, SamplingParams(max_new_tokens=20), SpecParams(k=4))
    assert spec.token_ids == plain.token_ids and plain.new_tokens == 20
    assert spec.drafted > 0


def test_vocab_mismatch_is_named(tmp_path, pair_dirs):
    t, _ = pair_dirs
    other = dict(ENGINE_CFG, vocab_size=ENGINE_CFG["vocab_size"] + 4)
    d = save_folder(hf_model(other, 2), tiny_tokenizer(), tmp_path / "bigger")
    with pytest.raises(ModelLoadError, match="vocabulary mismatch"):
        load_engine(str(t), str(d), device="cpu")


def test_missing_path_is_clear(tmp_path):
    with pytest.raises(ModelLoadError, match="nothing-here"):
        load_engine(str(tmp_path / "nothing-here"), device="cpu")


def test_bench_cli_writes_contract_json(tmp_path, pair_dirs, capsys):
    t, d = pair_dirs
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("\n".join(json.dumps({"id": f"p{i}", "messages": [{"role": "user", "content": c}]})
                                 for i, c in enumerate(["hi there", "abcabc", "2+2"])))
    out = tmp_path / "out.json"
    rc = bench_main(["--target", str(t), "--draft", str(d), "--prompts", str(prompts), "--max-new-tokens", "12",
                     "--k", "1,3", "--temperature", "0", "--seed", "1", "--modes", "plain,draft,ngram",
                     "--json", str(out), "--device", "cpu"])
    assert rc == 0
    data = json.loads(out.read_text())
    assert set(data) == {"device", "target", "draft", "kernels", "results", "categories", "identical_to_plain",
                         "default_vs_best", "per_reply"}
    assert data["default_vs_best"] == {}  # no default mode, one category
    assert data["identical_to_plain"] == {"draft K=1": True, "draft K=3": True, "ngram K=1": True, "ngram K=3": True}
    modes = [(r["mode"], r["k"]) for r in data["results"]]
    assert modes == [("plain", 0), ("draft", 1), ("draft", 3), ("ngram", 1), ("ngram", 3)]
    plain = data["results"][0]["outputs"]
    assert len(plain) == 3
    for r in data["results"]:
        assert {"mode", "k", "temperature", "tokens_per_s", "e2e_tokens_per_s", "new_tokens", "rounds",
                "drafted_tokens", "accepted_tokens", "acceptance_rate", "alpha", "mean_accepted_length", "c",
                "verify_ms_by_width", "pass_steps", "stop_below", "adaptive", "outputs"} <= set(r)
        assert r["outputs"] == plain  # greedy: every mode gives the same tokens
        assert r["tokens_per_s"] > 0
    assert "tok/s" in capsys.readouterr().out


def test_bench_rejects_bad_k(tmp_path, pair_dirs):
    t, d = pair_dirs
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "x"}]}))
    with pytest.raises(SystemExit, match="K must be >= 1"):
        bench_main(["--target", str(t), "--draft", str(d), "--prompts", str(prompts), "--k", "0"])


def test_bench_reads_spec_bench_questions_and_reports_per_category(tmp_path, pair_dirs, capsys):
    """Spec-Bench's own format: a two-turn question asks its second turn after the model's own first answer; the
    JSON has each category's figures and the overall ones."""
    t, d = pair_dirs
    questions = tmp_path / "question.jsonl"
    questions.write_text("\n".join(json.dumps(q) for q in [
        {"question_id": 81, "category": "writing", "turns": ["Write a line about the sea.", "Now make it rhyme."]},
        {"question_id": 101, "category": "math_reasoning", "turns": ["What is 12 times 12?"]},
    ]))
    out = tmp_path / "out.json"
    rc = bench_main(["--target", str(t), "--draft", str(d), "--prompts", str(questions), "--max-new-tokens", "10",
                     "--k", "3", "--temperature", "0", "--modes", "plain,draft,default", "--json", str(out),
                     "--device", "cpu"])
    assert rc == 0
    data = json.loads(out.read_text())
    plain, draft, default = data["results"]
    assert len(plain["outputs"]) == 3  # two turns, then one
    assert draft["outputs"] == plain["outputs"] == default["outputs"]
    assert data["identical_to_plain"] == {"draft K=3": True, "default": True}
    cats = data["categories"]
    assert set(cats) == {"mt-bench", "math_reasoning", "overall"}  # "writing" is one of MT-bench's own eight
    for figures in (cats["mt-bench"]["draft K=3"], cats["overall"]["draft K=3"]):
        assert figures["speedup"] > 0 and figures["mean_accepted_length"] >= 1.0
        assert 0.0 <= figures["acceptance_rate"] <= 1.0
        assert all(0.0 <= a <= 1.0 for a in figures["acceptance_per_position"])
    assert cats["mt-bench"]["plain"]["mean_accepted_length"] == 1.0 and cats["mt-bench"]["plain"]["speedup"] == 1.0
    assert cats["mt-bench"]["draft K=3"]["new_tokens"] == 20  # both turns ran to the token limit
    assert cats["overall"]["draft K=3"]["speedup_geomean"] > 0
    # the default against the draft model on the same replies (plain is no rival), each reply's time kept
    assert set(data["default_vs_best"]) == {"mt-bench", "math_reasoning", "geomean"}
    for v in data["default_vs_best"].values():
        assert v["best"] == "draft K=3" and v["low"] <= v["ratio"] <= v["high"], v
    assert [n for n, _ in data["per_reply"]["default"]["mt-bench"]] == [10, 10]
    assert all(s > 0 for _, s in data["per_reply"]["plain"]["mt-bench"])
    printed = capsys.readouterr().out
    assert "mt-bench" in printed and "geomean speedup" in printed and "bootstrap interval" in printed
    for c in ("mt-bench", "math_reasoning"):  # and over plain, the other bar, on the same replies
        p = data["default_vs_best"][c]["plain"]
        assert p["low"] <= p["ratio"] <= p["high"] and p["ratio"] > 0, p
    assert "/ plain" in printed
