"""speclens-bench refuses bad arguments up front: one line on stderr, a non-zero exit, and no model loaded."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import engine.io.provision
import engine.tools.bench as bench_mod
from engine.tools.bench import main
from engine.tools.prompt_file import read_prompts

GOOD_LINE = json.dumps({"id": "a", "messages": [{"role": "user", "content": "hi"}]})


@pytest.fixture
def no_loading(monkeypatch):
    """Reaching any model loading is a test failure: every case must be refused before it."""

    def reached(*args, **kwargs):
        pytest.fail("a model load was attempted before the arguments were checked")

    monkeypatch.setattr(bench_mod, "load_engine", reached)
    monkeypatch.setattr(engine.io.provision, "default_pair", reached)


@pytest.fixture
def prompts(tmp_path) -> Path:
    p = tmp_path / "prompts.jsonl"
    p.write_text(GOOD_LINE + "\n", encoding="utf-8")
    return p


def write(tmp_path: Path, name: str, data: bytes) -> str:
    (tmp_path / name).write_bytes(data)
    return str(tmp_path / name)


# (case id, extra arguments given tmp_path (replacing the good --prompts when they bring their own), expected reason)
CASES = [
    ("k-too-large", lambda t: ["--k", "1000"], "K must be <= 16, got 1000"),
    ("k-in-list-too-large", lambda t: ["--k", "1,2,99"], "K must be <= 16, got 99"),
    ("k-zero", lambda t: ["--k", "0"], "every K must be >= 1"),
    ("k-not-a-number", lambda t: ["--k", "four"], "--k must be an integer"),
    ("json-in-missing-folder", lambda t: ["--json", str(t / "missing" / "out.json")], "cannot write --json file"),
    ("json-is-a-folder", lambda t: ["--json", str(t)], "is a directory"),
    ("negative-temperature", lambda t: ["--temperature", "-1"], "temperature must be in [0, 10], got -1.0"),
    ("nan-temperature", lambda t: ["--temperature", "nan"], "temperature must be a finite number"),
    ("zero-top-p", lambda t: ["--top-p", "0"], "top_p must be in (0, 1], got 0.0"),
    ("zero-max-new-tokens", lambda t: ["--max-new-tokens", "0"], "max_new_tokens must be >= 1"),
    ("negative-seed", lambda t: ["--seed", "-3"], "seed must be in [0, 2**64)"),
    ("not-a-float", lambda t: ["--temperature", "warm"], "argument --temperature: invalid float value"),
    ("unknown-mode", lambda t: ["--modes", "plain,beam"], "unknown mode(s) ['beam']"),
    ("bad-device", lambda t: ["--device", "warp9"], "--device 'warp9' is not a device"),
    ("draft-without-target", lambda t: ["--draft", "x"], "--draft given without --target"),
    ("draft-mode-without-draft", lambda t: ["--target", "x", "--modes", "draft"], "mode 'draft' needs --draft"),
    ("hybrid-mode-without-draft", lambda t: ["--target", "x", "--modes", "hybrid"], "mode 'hybrid' needs --draft"),
    ("prompts-missing", lambda t: ["--prompts", str(t / "none.jsonl")], "prompts file not found"),
    ("prompts-not-utf8", lambda t: ["--prompts", write(t, "latin1.jsonl", GOOD_LINE.replace("hi", "caf\xe9")
                                                    .encode("latin-1"))], "is not UTF-8 text"),
    ("message-not-an-object", lambda t: ["--prompts", write(t, "m.jsonl", b'{"messages": ["hi"]}\n')],
     "m.jsonl:1: bad prompt line (message 1 must be an object with string 'role' and 'content', got 'hi')"),
    ("line-not-an-object", lambda t: ["--prompts", write(t, "l.jsonl", b'["hi"]\n')],
     "l.jsonl:1: bad prompt line (expected a JSON object, got a list)"),
    ("content-not-a-string", lambda t: ["--prompts", write(t, "c.jsonl", b'{"messages": [{"role": "user", '
                                                                          b'"content": 5}]}\n')],
     "message 1 must be an object"),
    ("no-prompts", lambda t: ["--prompts", write(t, "e.jsonl", b"\n\n")], "holds no prompts"),
    ("stop-below-one", lambda t: ["--stop-below", "1.0"], "stop_below must be in [0, 1), got 1.0"),
    ("no-repeats", lambda t: ["--repeats", "0"], "--repeats must be in 1..100, got 0"),
    ("negative-min-tokens", lambda t: ["--min-tokens", "-5"], "--min-tokens must be in 0..1000000, got -5"),
    ("no-questions-a-category", lambda t: ["--per-category", "0"], "--per-category must be at least 1, got 0"),
]


@pytest.mark.parametrize("args,reason", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_arguments_fail_before_loading(tmp_path, prompts, no_loading, capsys, args, reason):
    extra = args(tmp_path)
    argv = ([] if "--prompts" in extra else ["--prompts", str(prompts)]) + extra
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    message = exit_.value.code
    # A SystemExit carrying a string exits with status 1 and prints exactly that string to stderr.
    assert isinstance(message, str), message
    assert message.startswith("speclens-bench: ") and "\n" not in message
    assert reason in message
    assert capsys.readouterr().err == ""  # nothing else (no usage block, no traceback)


def test_the_write_check_leaves_no_file_behind(tmp_path, prompts, no_loading):
    new = tmp_path / "new.json"
    old = tmp_path / "old.json"
    old.write_text("keep me")
    for out in (new, old):
        with pytest.raises(SystemExit, match="is not a device"):  # a check after the --json check fails
            main(["--prompts", str(prompts), "--json", str(out), "--device", "warp9"])
    assert not new.exists()
    assert old.read_text() == "keep me"


def test_command_line_prints_one_line_and_exits_non_zero(tmp_path, prompts):
    out = subprocess.run([sys.executable, "-m", "engine.tools.bench", "--prompts", str(prompts), "--k", "1000"],
                         capture_output=True, text=True, cwd=Path(__file__).resolve().parents[2])
    assert out.returncode != 0
    assert out.stderr.splitlines() == ["speclens-bench: --k 1000: K must be <= 16, got 1000"]
    assert out.stdout == ""


def test_good_arguments_reach_loading_and_run(tmp_path, prompts, monkeypatch):
    """The checks refuse nothing valid: the same run with good arguments loads, benchmarks and writes JSON."""
    from tests.tiny import tiny_engine

    eng = tiny_engine()
    monkeypatch.setattr(engine.io.provision, "default_pair", lambda **kw: (tmp_path / "t", tmp_path / "d"))
    monkeypatch.setattr(bench_mod, "load_engine", lambda target, draft, device=None: eng)
    out = tmp_path / "out.json"
    rc = main(["--prompts", str(prompts), "--k", "1,16", "--temperature", "0.5", "--top-p", "0.9",
               "--max-new-tokens", "4", "--modes", "plain,draft", "--json", str(out), "--device", "cpu"])
    assert rc == 0
    results = json.loads(out.read_text())["results"]
    assert [(r["mode"], r["k"]) for r in results] == [("plain", 0), ("draft", 1), ("draft", 16)]
    assert json.loads(out.read_text())["kernels"] == "none (dense weights)"  # which kernels ran, said
    # --repeats asks every prompt again: twice the tokens, each mode's outputs the same list twice over
    n_prompts = len(read_prompts(str(prompts)))
    assert main(["--prompts", str(prompts), "--k", "1", "--max-new-tokens", "4", "--modes", "plain,draft",
                 "--json", str(out), "--repeats", "2"]) == 0
    twice = json.loads(out.read_text())
    for r in twice["results"]:
        assert len(r["outputs"]) == 2 * n_prompts and r["outputs"][:n_prompts] == r["outputs"][n_prompts:]
    assert twice["identical_to_plain"] == {"draft K=1": True}
    # --min-tokens tops a kind up: two kinds of one question each, 4 tokens a reply, at least 10 tokens a kind
    two = tmp_path / "two.jsonl"
    two.write_text("\n".join(json.dumps({"question_id": i, "category": c, "turns": ["hi"]})
                             for i, c in enumerate(("qa", "translation"))), encoding="utf-8")
    assert main(["--prompts", str(two), "--k", "1", "--max-new-tokens", "4", "--modes", "plain,draft",
                 "--json", str(out), "--min-tokens", "10"]) == 0
    topped = json.loads(out.read_text())
    for mode in ("plain", "draft K=1"):
        for kind in ("qa", "translation"):
            figures = topped["categories"][kind][mode]
            assert (figures["replies"], figures["new_tokens"]) == (3, 12), (mode, kind, figures)
    assert topped["identical_to_plain"] == {"draft K=1": True}


def test_the_json_records_what_each_mode_drafted_and_cost(tmp_path, prompts, monkeypatch):
    """Per mode: the app's early stop and adaptive K as run, drafted and accepted totals that add up to the
    acceptance rate, alpha, rounds, c against the plain step, and the verify passes by width in plain steps."""
    from tests.tiny import tiny_engine

    eng = tiny_engine()
    monkeypatch.setattr(engine.io.provision, "default_pair", lambda **kw: (tmp_path / "t", tmp_path / "d"))
    monkeypatch.setattr(bench_mod, "load_engine", lambda target, draft, device=None: eng)
    out = tmp_path / "out.json"
    assert main(["--prompts", str(prompts), "--k", "3", "--max-new-tokens", "24", "--modes", "plain,draft,hybrid",
                 "--stop-below", "0.7", "--adaptive", "--json", str(out)]) == 0
    plain, draft, hybrid = json.loads(out.read_text())["results"]
    assert plain["drafted_tokens"] == 0 and plain["alpha"] is None and set(plain["pass_steps"]) == {"1"}
    assert plain["pass_steps"]["1"] == pytest.approx(1.0)
    for r in (draft, hybrid):
        assert (r["stop_below"], r["adaptive"]) == (0.7, True)
        assert r["drafted_tokens"] > 0 and 0 <= r["accepted_tokens"] <= r["drafted_tokens"]
        assert r["acceptance_rate"] == pytest.approx(r["accepted_tokens"] / r["drafted_tokens"])
        assert 0 < r["alpha"] <= 1 and r["rounds"] > 0
        assert r["tokens_per_s"] >= r["e2e_tokens_per_s"] > 0  # the decode rate leaves the prefills out
        assert set(r["pass_steps"]) == set(r["verify_ms_by_width"]) and max(map(int, r["pass_steps"])) <= 4
    assert draft["c"] == pytest.approx(draft["draft_ms_per_token"] / plain["verify_ms_by_width"]["1"])
    assert hybrid["c"] is None  # its n-gram rounds cost nothing: c would mix two drafters


def test_a_quantized_run_names_the_kernels_that_ran():
    from engine.cpu import ext

    class Quantized:
        weights_format = "Q4_K_M"

    said = bench_mod.ran_kernels(Quantized())
    assert said == ext.describe() and (said.endswith(("(prebuilt)", "(cache)", "(compiled)")) or "fallback" in said)


def test_a_gpu_run_says_whether_its_short_passes_were_cuda_graphs():
    from types import SimpleNamespace

    def on_gpu(graphs):
        return SimpleNamespace(device=torch.device("cuda"), target=SimpleNamespace(graphs=graphs), weights_format=None)

    assert bench_mod.ran_kernels(on_gpu(object())) == "cuBLAS, short passes as CUDA graphs"
    assert bench_mod.ran_kernels(on_gpu(None)) == "cuBLAS, eager (no CUDA graphs)"
