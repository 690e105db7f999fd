"""engine.tools.draft_finder on tiny models built here: the static checks turn down what cannot draft, each with its
reason; the measured ranking is sorted by measured speedup with Leviathan's prediction beside it, greedy output
stays plain decoding's; a cancel stops between rounds; the command prints the table and the JSON."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.analysis.theory import theoretical_speedup
from engine.io import hub
from engine.io.loading import load_engine
from engine.tools import bench
from engine.tools import draft_candidates as dc
from engine.tools import draft_finder as df
from tests.engine.test_model_dirs import header_gguf, home, put  # noqa: F401 - home: a fixture
from tests.engine.test_weights import make_hf_model, make_tokenizer, write_gguf

CFG = df.FinderConfig(max_new_tokens=8, ks=(1, 2), time_budget_s=120)
PROMPTS = [[{"role": "user", "content": "def add(a, b):"}], [{"role": "user", "content": "hello world"}]]


@pytest.fixture(scope="module")
def zoo(tmp_path_factory) -> dict[str, Path]:
    """A 4-layer target; its first two layers as a draft (a folder and a GGUF); a bigger model; one with two
    tokens swapped; a family SpecLens does not run."""
    root = tmp_path_factory.mktemp("zoo")
    tok = make_tokenizer()
    target = make_hf_model("llama", len(tok), num_hidden_layers=4)
    target.save_pretrained(root / "target")
    tok.save_pretrained(root / "target")
    draft = make_hf_model("llama", len(tok), num_hidden_layers=2)
    state = {k: v for k, v in target.state_dict().items() if not k.startswith("model.layers.") or
             int(k.split(".")[2]) < 2}
    draft.load_state_dict(state)  # the target's own first layers: a draft that agrees with it some of the time
    draft.save_pretrained(root / "draft")
    tok.save_pretrained(root / "draft")
    write_gguf(root / "draft-q8.gguf", draft, tok, "Q8_0")
    big = make_hf_model("llama", len(tok), num_hidden_layers=6)
    big.save_pretrained(root / "big")
    tok.save_pretrained(root / "big")
    draft.save_pretrained(root / "swapped")
    tok.save_pretrained(root / "swapped")
    spec = json.loads((root / "swapped" / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    a, b = sorted(vocab, key=vocab.get)[100:102]
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (root / "swapped" / "tokenizer.json").write_text(json.dumps(spec))
    header_gguf(root / "other.gguf", "gpt2")
    return {p.name.removesuffix(".gguf"): p for p in root.iterdir()}


def no_eos_loader(target, draft, device=None):
    """load_engine, run to the token limit: a random model says EOS early."""
    engine = load_engine(target, draft, device=device)
    engine.eos_ids = set()
    return engine


def described(*paths: Path) -> list:
    return [hub.describe(p, "test") for p in paths]


def test_static_checks_keep_what_can_draft_and_say_why_not_for_the_rest(zoo):
    target = hub.describe(zoo["target"], "test")
    ok, rejected = dc.static_checks(target, described(zoo["target"], zoo["draft"], zoo["draft-q8"], zoo["big"],
                                                       zoo["swapped"], zoo["other"]))
    assert sorted(c.path for c in ok) == sorted([str(zoo["draft"]), str(zoo["draft-q8"])])
    why = {Path(r.candidate.path).name: r.reason for r in rejected}
    assert set(why) == {"big", "swapped", "other.gguf"}  # the target itself is no candidate at all
    assert why["big"].startswith("not smaller than the target")
    assert "different vocabulary: token 100" in why["swapped"]
    assert why["other.gguf"].startswith("SpecLens cannot run it")


def test_vocabulary_mismatch_reads_specials_and_skips_ids_one_side_leaves_empty():
    t = dc.Vocabulary(("a", "b", "c"), {"bos": 0, "eos": 2})
    assert dc.vocabulary_mismatch(t, dc.Vocabulary(("a", "b", "c", "[PAD3]"), {"eos": 2})) is None
    assert dc.vocabulary_mismatch(t, dc.Vocabulary(("a", None, "c"), {})) is None
    assert dc.vocabulary_mismatch(t, dc.Vocabulary(("a", "x", "c"), {})) == \
        "a different vocabulary: token 1 is 'b' in the target and 'x' in this model"
    assert "EOS" in dc.vocabulary_mismatch(t, dc.Vocabulary(("a", "b", "c"), {"eos": 1}))


def test_the_ranking_is_measured_sorted_and_exact(zoo):
    seen = []
    result = df.find_drafts(str(zoo["target"]), [str(zoo["draft"]), str(zoo["draft-q8"]), str(zoo["big"]),
                                                 str(tmp_missing := zoo["target"].parent / "nowhere")],
                            PROMPTS, CFG, lambda stage, f: seen.append((stage, f)), loader=no_eos_loader)
    names = [m.candidate.name for m in result.measured]
    assert sorted(names) == sorted(["draft", "draft-q8", dc.NGRAM])
    speedups = [m.speedup for m in result.measured]
    assert speedups == sorted(speedups, reverse=True) and result.best is result.measured[0]
    for m in result.measured:
        assert m.identical_to_plain, m.candidate.name  # greedy: every reply token for token plain decoding's
        assert set(m.speedup_by_k) == {1, 2} and m.best_k in (1, 2)
        assert m.speedup == m.speedup_by_k[m.best_k] == max(m.speedup_by_k.values())
        assert m.speedup == pytest.approx(m.tokens_per_s / m.plain_tokens_per_s)
        assert m.alpha is not None and 0.0 <= m.alpha <= 1.0 and m.c is not None and m.c >= 0.0
        assert m.predicted == pytest.approx(theoretical_speedup(m.alpha, m.best_k, m.c))
        assert 1.0 <= m.mean_accepted_length <= m.best_k + 1
    rejected = {Path(r.candidate.path).name: r.reason for r in result.rejected}
    assert rejected["big"].startswith("not smaller") and "no such file" in rejected[tmp_missing.name]
    assert not result.not_measured and not result.cancelled
    fractions = [f for _, f in seen]
    assert fractions == sorted(fractions) and fractions[-1] == 1.0  # progress only moves forward
    data = json.loads(json.dumps(result.to_json()))  # plain JSON
    assert [m["name"] for m in data["measured"]] == names and data["target"]["name"] == "target"


def test_by_default_the_candidates_are_the_models_the_listing_finds(zoo, home):  # noqa: F811 - the fixture
    put(zoo["draft-q8"], home / ".lmstudio" / "models" / "me" / "tiny-GGUF" / "draft-q8.gguf")
    put(zoo["other"], home / ".cache" / "llama.cpp" / "other.gguf")
    result = df.find_drafts(str(zoo["target"]), None, PROMPTS[:1], df.FinderConfig(max_new_tokens=4, ks=(1,)),
                            ngram=False, loader=no_eos_loader)
    assert [(m.candidate.name, m.candidate.source) for m in result.measured] == [("me/tiny-GGUF/draft-q8.gguf",
                                                                                 "lm-studio")]
    assert [(r.candidate.name, r.reason.split(":")[0]) for r in result.rejected] == [
        ("other.gguf", "SpecLens cannot run it")]


def test_the_figures_are_the_ones_a_separate_speclens_bench_run_gives(zoo):
    """Counts, not timings: alpha and the mean accepted length of a K equal bench.run_mode's on the same pair."""
    result = df.find_drafts(str(zoo["target"]), [str(zoo["draft"])], PROMPTS, df.FinderConfig(max_new_tokens=8, ks=(2,)),
                            ngram=False, loader=no_eos_loader)
    (m,) = result.measured
    engine = no_eos_loader(str(zoo["target"]), str(zoo["draft"]))
    ids = [engine.encode_chat(p) for p in PROMPTS]
    sampling = df.SamplingParams(temperature=0.0, max_new_tokens=8, seed=0)
    spec, plain = (bench.run_mode(engine, ids, mode, 2, sampling) for mode in ("draft", "plain"))
    assert m.alpha is not None and spec.drafted_tokens > 0
    assert m.alpha == pytest.approx(spec.alpha) and m.mean_accepted_length == pytest.approx(spec.mean_accepted_length)
    assert spec.outputs == plain.outputs and m.identical_to_plain


def test_a_draft_that_fails_to_load_is_reported_and_the_others_measured(zoo):
    def loader(target, draft, device=None):
        if draft is not None and draft.endswith(".gguf"):
            raise df.ModelLoadError("the file is damaged")
        return no_eos_loader(target, draft, device)

    result = df.find_drafts(str(zoo["target"]), [str(zoo["draft-q8"]), str(zoo["draft"])], PROMPTS[:1],
                            df.FinderConfig(max_new_tokens=4, ks=(1,)), loader=loader)
    assert sorted(m.candidate.name for m in result.measured) == ["draft", dc.NGRAM]
    failed = [r for r in result.rejected if r.candidate.name == "draft-q8"]
    assert failed and failed[0].reason == "failed to load or run: the file is damaged"


def test_a_cancel_stops_between_rounds_and_leaves_the_rest_unmeasured(zoo):
    rounds = []

    def loader(target, draft, device=None):
        engine = no_eos_loader(target, draft, device)
        original = engine.generate

        def generate(*args, **kwargs):
            for ev in original(*args, **kwargs):
                rounds.append(ev)
                yield ev
        engine.generate = generate
        return engine

    result = df.find_drafts(str(zoo["target"]), [str(zoo["draft"]), str(zoo["draft-q8"])], PROMPTS,
                            df.FinderConfig(max_new_tokens=32, ks=(1, 2)), cancelled=lambda: len(rounds) >= 12,
                            loader=loader)
    assert result.cancelled and not result.measured
    # The warm-up (a few rounds) and then the plain replay, cut within a round of the cancel
    assert len(rounds) <= 12 + 2
    assert sorted(r.candidate.name for r in result.not_measured) == ["draft", "draft-q8", dc.NGRAM]
    assert all(r.reason == "cancelled before it was measured" for r in result.not_measured)


def test_the_time_budget_bounds_the_measuring(zoo):
    result = df.find_drafts(str(zoo["target"]), [str(zoo["draft"])], PROMPTS[:1],
                            df.FinderConfig(max_new_tokens=4, ks=(1,), time_budget_s=1e-3), loader=no_eos_loader)
    assert result.out_of_time and not result.measured
    assert {r.candidate.name for r in result.not_measured} == {"draft", dc.NGRAM}
    assert "time budget" in result.not_measured[0].reason


@pytest.mark.parametrize("kw, words", [({"max_new_tokens": 0}, "max_new_tokens"), ({"ks": ()}, "every K"),
                                       ({"ks": (1, 0)}, "every K"), ({"time_budget_s": 0}, "time budget"),
                                       ({"time_budget_s": float("nan")}, "time budget")])
def test_settings_are_checked_where_they_enter(kw, words):
    with pytest.raises(ValueError, match=words):
        df.FinderConfig(**kw)
    with pytest.raises(ValueError, match="at least one prompt"):
        df.check_prompts([])
    with pytest.raises(ValueError):
        df.check_prompts([[{"role": "user"}]])


def test_speclens_bench_find_drafts_prints_the_table_and_the_json(zoo, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr("engine.io.loading.load_engine", no_eos_loader)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"messages": PROMPTS[0]}) + "\n")
    argv = ["--find-drafts", "--target", str(zoo["target"]), "--candidates", str(zoo["draft"]), str(zoo["big"]),
            "--prompts", str(prompts), "--max-new-tokens", "4", "--k", "1", "--no-ngram"]
    assert bench.main(argv) == 0
    out = capsys.readouterr().out
    assert "DRAFT" in out and "LEVIATHAN" in out and "\ndraft " in out
    assert "not a draft: big: not smaller than the target" in out
    assert bench.main(argv + ["--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [m["name"] for m in data["measured"]] == ["draft"] and data["measured"][0]["best_k"] == 1
    with pytest.raises(SystemExit, match="every K"):
        bench.main(["--find-drafts", "--target", str(zoo["target"]), "--k", "0"])


def test_a_file_found_in_several_places_is_measured_once(zoo, home):  # noqa: F811 - the fixture
    """LM Studio and llama.cpp keep the same download: one measurement, the other listed as its copy. A file of the
    same size with other bytes is no copy."""
    lms = put(zoo["draft-q8"], home / ".lmstudio" / "models" / "me" / "tiny-GGUF" / "draft-q8.gguf")
    cpp = put(zoo["draft-q8"], home / ".cache" / "llama.cpp" / "draft-q8.gguf")
    other = put(zoo["draft-q8"], home / "other" / "draft-q8-edited.gguf")
    data = bytearray(other.read_bytes())
    data[-1] ^= 0xFF  # the last weight byte: the same size, not the same file
    other.write_bytes(bytes(data))
    cands = [dc.Candidate("a", str(lms), "lm-studio"), dc.Candidate("dir", str(zoo["draft"]), "folder"),
             dc.Candidate("b", str(cpp), "llama.cpp"), dc.Candidate("c", str(other), "given"), dc.NGRAM_CANDIDATE]
    kept, copies = dc.distinct_files(cands)
    assert [c.name for c in kept] == ["a", "dir", "c", dc.NGRAM]
    assert [(c.candidate.name, c.same_as.name) for c in copies] == [("b", "a")]
    assert copies[0].reason == "the same file as a (LM Studio): measured once, under that name"
    assert dc.distinct_files(cands, cancelled=lambda: True) == (cands, [])  # a cancel leaves the list as it was

    result = df.find_drafts(str(zoo["target"]), None, PROMPTS[:1], df.FinderConfig(max_new_tokens=4, ks=(1,)),
                            ngram=False, loader=no_eos_loader)
    assert [m.candidate.source for m in result.measured] == ["lm-studio"]
    assert [(c.candidate.source, c.same_as.source) for c in result.copies] == [("llama.cpp", "lm-studio")]
    data = result.to_json()
    assert data["copies"][0]["same_as"] == str(lms) and data["copies"][0]["reason"].startswith("the same file as")
    assert "same file: draft-q8.gguf: the same file as" in df.table(result)


def _measured(name: str, path: str | None, speedup: float, k: int) -> df.Measured:
    return df.Measured(dc.Candidate(name, path), speedup, k, 0.7, 0.1, 2.0, 1.5, 30.0, 20.0, {k: speedup}, True)


def test_a_lead_within_the_finders_noise_says_how_to_tell_the_two_apart():
    tgt = dc.Candidate("tgt", "/m/target dir/t.gguf")
    cfg = df.FinderConfig(ks=(1, 2))
    clear = df.FinderResult(tgt, cfg, 3, [_measured("d", "/m/d.gguf", 1.40, 2), _measured(dc.NGRAM, None, 1.20, 1)])
    assert clear.near_tie is False and not clear.to_json()["near_tie"]  # 1.40 / 1.20 = 1.167: a lead
    assert "noise" not in df.table(clear)
    tie = df.FinderResult(tgt, cfg, 3, [_measured("d", "/m/d.gguf", 1.30, 2), _measured(dc.NGRAM, None, 1.20, 1)])
    assert tie.near_tie and tie.to_json()["near_tie"]
    advice = df.near_tie_advice(tie.to_json())
    assert advice.startswith("d leads n-gram (prompt lookup) by 8%, within the finder's noise (about 10%)")
    assert advice.endswith("speclens-bench --target '/m/target dir/t.gguf' --prompts YOUR_PROMPTS.jsonl --k 1,2 "
                           "--max-new-tokens 128 --draft /m/d.gguf --modes plain,draft,ngram")
    assert advice in df.table(tie)
    two = df.FinderResult(tgt, cfg, 3, [_measured("d", "/m/d.gguf", 1.3, 2), _measured("e", "/m/e.gguf", 1.25, 2)])
    assert df.near_tie_advice(two.to_json()).count("--modes plain,draft") == 2  # bench takes one draft a run
    assert df.FinderResult(tgt, cfg, 3, [_measured("d", "/m/d.gguf", 1.3, 2)]).near_tie is False


def test_every_setting_replays_a_prompt_before_the_next_and_the_first_moves_along(zoo):
    """Plain decoding and each K take turns prompt by prompt, so drift over the minutes weighs on all; a cancel keeps
    the prompts every setting finished."""
    replays: list[tuple[int, str | None, int]] = []  # (prompt length, drafter, K)

    def loader(target, draft, device=None):
        engine = no_eos_loader(target, draft, device)
        original = engine.generate

        def generate(ids, sampling, spec, controls=None):
            if sampling.max_new_tokens > 4:  # not the warm-up
                replays.append((len(ids), spec.drafter if spec.enabled else None, spec.k if spec.enabled else 0))
            yield from original(ids, sampling, spec, controls)
        engine.generate = generate
        return engine

    cfg = df.FinderConfig(max_new_tokens=6, ks=(1, 2))
    result = df.find_drafts(str(zoo["target"]), [str(zoo["draft"])], PROMPTS, cfg, loader=loader)
    settings = [(None, 0), ("model", 1), ("model", 2), ("ngram", 1), ("ngram", 2)]
    assert [r[1:] for r in replays] == settings + settings[1:] + settings[:1]
    assert len({r[0] for r in replays[:5]}) == 1 and len({r[0] for r in replays[5:]}) == 1
    assert replays[0][0] != replays[5][0]  # the first prompt's five replays, then the second's
    assert {m.candidate.name for m in result.measured} == {"draft", dc.NGRAM}
    assert not any(m.note for m in result.measured)

    replays.clear()
    stopped = df.find_drafts(str(zoo["target"]), [str(zoo["draft"])], PROMPTS, cfg, loader=loader,
                             cancelled=lambda: len(replays) > 6)
    assert stopped.cancelled and len(replays) == 7  # the second prompt cut short in its second setting
    assert {m.candidate.name for m in stopped.measured} == {"draft", dc.NGRAM}
    for m in stopped.measured:  # measured on the first prompt alone, as every setting finished it
        assert m.note == "cancelled after 1 of 2 prompts" and m.identical_to_plain
