"""Benchmark records (engine/tools/results.py) and the page rendered from them (scripts/bench/render_results.py)."""
import json
import subprocess

import pytest

from engine.cpu.machine import parse_cpuinfo
from engine.tools import results
from engine.tools.results import Record, cpu_kind, load_records, machine, write_record
from scripts.bench import render_results

ZEN3 = ("vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\nmodel name\t: AMD EPYC 7B13\n"
        "flags\t\t: sse4_2 avx avx2 fma f16c\n")
ZEN4 = ("vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\nmodel name\t: AMD EPYC 9R14\n"
        "flags\t\t: avx2 fma avx512f avx512bw avx512vl avx512_vnni avx512_bf16\n")
XEON = ("vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 207\nmodel name\t: Intel(R) Xeon(R) Platinum 8581C\n"
        "flags\t\t: avx2 fma avx512f avx512bw avx512_vnni avx_vnni amx_int8\n")


@pytest.mark.parametrize("text, kind", [
    (ZEN3, "AMD Zen 3"),
    (ZEN4, "AMD Zen 4"),
    (ZEN4.replace("model\t\t: 17", "model\t\t: 97"), "AMD Zen 4"),  # 0x61: a Raphael desktop part
    (ZEN3.replace("model\t\t: 1", "model\t\t: 33"), "AMD Zen 3"),  # 0x21: Vermeer
    (ZEN4.replace("cpu family\t: 25", "cpu family\t: 26").replace("model\t\t: 17", "model\t\t: 2"), "AMD Zen 5"),
    (XEON, "Intel family 6 model 207 (AVX-512 VNNI + AVX-VNNI)"),
    (XEON.replace(" avx_vnni", ""), "Intel family 6 model 207 (AVX-512 VNNI)"),
    (XEON.replace(" avx512f avx512bw avx512_vnni", ""), "Intel family 6 model 207 (AVX-VNNI)"),
])
def test_the_kind_label_follows_family_model_and_flags(text, kind):
    assert cpu_kind(parse_cpuinfo(text, 2)) == kind


def test_a_cuda_run_is_kinded_by_its_gpu_and_keeps_the_host_cpu():
    m = machine(parse_cpuinfo(ZEN4, 16), gpu="NVIDIA H200")
    assert (m["kind"], m["cpu_kind"], m["gpu"], m["logical"]) == ("NVIDIA H200", "AMD Zen 4", "NVIDIA H200", 16)
    assert m["flags"] == ["avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16"]


def test_a_record_round_trips(tmp_path):
    figures = {"ours": {"plain": {"tokens_per_s": 37.4}}, "pass_ms": {1: 32.7, 9: float("nan")}, "where": tmp_path}
    path = write_record(tmp_path, "scripts.bench.cpu", ["--limit", "2"], figures, cpu=parse_cpuinfo(ZEN4, 2))
    assert path.parent == tmp_path and path.name.startswith(f"{path.name[:10]}_bench-cpu_amd-zen-4_")
    [rec] = load_records(tmp_path, warn=pytest.fail)
    assert rec.path == path and rec.tool == "scripts.bench.cpu" and rec.args == ["--limit", "2"]
    assert rec.kind == "AMD Zen 4" and rec.machine["family"] == "25" and rec.machine["model"] == "17"
    assert rec.date.endswith("Z") and rec.schema == results.SCHEMA and rec.imported is False
    # JSON's own shapes: keys as text, NaN as null (a strict reader refuses NaN), a path as its text
    assert rec.figures == {"ours": {"plain": {"tokens_per_s": 37.4}}, "pass_ms": {"1": 32.7, "9": None},
                           "where": str(tmp_path)}
    assert Record.from_dict(rec.to_dict(), path) == rec
    assert json.loads(path.read_text())["schema"] == results.SCHEMA
    assert not list(tmp_path.glob(".record-*"))  # the aside copy is gone


def test_two_runs_of_one_minute_get_two_files(tmp_path):
    cpu = parse_cpuinfo(ZEN3, 2)
    a = write_record(tmp_path, "speclens-bench", [], {"x": 1}, cpu=cpu)
    b = write_record(tmp_path, "speclens-bench", [], {"x": 2}, cpu=cpu)
    assert a != b and b.stem.endswith("_2") and len(load_records(tmp_path, warn=pytest.fail)) == 2


def test_without_git_the_commit_is_unknown_and_the_record_still_written(tmp_path, monkeypatch):
    def no_git(*a, **kw):
        raise FileNotFoundError("git")

    monkeypatch.setattr(subprocess, "run", no_git)
    assert results.git_state() == ("unknown", None)
    path = write_record(tmp_path, "speclens-bench", None, {}, cpu=parse_cpuinfo(ZEN3, 2))
    assert "_unknown" in path.name and json.loads(path.read_text())["commit"] == "unknown"


def test_a_malformed_file_is_skipped_with_a_warning(tmp_path):
    good = write_record(tmp_path, "speclens-bench", [], {"x": 1}, cpu=parse_cpuinfo(ZEN3, 2))
    (tmp_path / "a_broken.json").write_text("{not json")
    d = json.loads(good.read_text())
    (tmp_path / "b_nokind.json").write_text(json.dumps({**d, "machine": {"name": "x"}}))
    (tmp_path / "c_future.json").write_text(json.dumps({**d, "schema": results.SCHEMA + 1}))
    warnings: list[str] = []
    recs = load_records(tmp_path, warn=warnings.append)
    assert [r.path for r in recs] == [good]
    assert len(warnings) == 3 and all(w.startswith("results: skipped ") for w in warnings)
    assert "a_broken.json" in warnings[0] and "kind" in warnings[1] and "newer" in warnings[2]


def test_records_are_off_when_asked(tmp_path, monkeypatch):
    import argparse

    ap = argparse.ArgumentParser()
    results.add_arguments(ap)
    monkeypatch.setenv(results.ENV, "off")
    assert results.record(ap.parse_args([]), "t", {}) is None  # the test suite's own setting
    assert results.record(ap.parse_args(["--results", str(tmp_path), "--no-record"]), "t", {}) is None
    assert not list(tmp_path.iterdir())
    path = results.record(ap.parse_args(["--results", str(tmp_path)]), "t", {"x": 1}, argv=["--results", "d"])
    assert path is not None and load_records(tmp_path, warn=pytest.fail)[0].args == ["--results", "d"]


def cpu_record(kind: str, date: str, plain: float, best: float, peer: float) -> Record:
    figures = {"ours": {"plain": {"tokens_per_s": plain}, "draft K=2": {"tokens_per_s": best},
                        "hybrid K=4 stop": {"tokens_per_s": best - 1}},
               "llama_cpp_plain_between_prompts": [peer - 1, None, peer + 1],
               "ratios": {"the app's default (hybrid K=4 stop) / llama.cpp plain (same minutes)": 1.0}}
    return Record(tool="scripts.bench.cpu", args=[], date=date, commit="0123456789abcdef", dirty=False,
                  machine={"kind": kind}, figures=figures)


def test_the_page_shows_the_latest_run_of_each_kind_and_every_run_in_its_history(tmp_path):
    for rec in (cpu_record("AMD Zen 4", "2026-11-27T10:00:00Z", 30.0, 40.0, 25.0),
                cpu_record("AMD Zen 4", "2026-11-28T10:00:00Z", 36.0, 48.0, 30.0),
                cpu_record("AMD Zen 3", "2026-11-26", 20.0, 24.0, 16.0)):
        results.save(tmp_path, rec)
    page = render_results.render(load_records(tmp_path, warn=pytest.fail))
    assert page.startswith(render_results.HEADER) and "Generated by `python -m scripts.bench.render_results`" in page
    current, history = page.split("## History")
    rows = [ln for ln in current.splitlines() if ln.startswith("| AMD Zen")]
    assert len(rows) == 2  # one a kind
    zen3, zen4 = rows
    # the later Zen 4 run wins: 36 plain, 48 best, llama.cpp 30 (its readings' mean), 1.20x, 1.60x, 1.33x
    assert zen4.startswith("| AMD Zen 4 | 2026-11-28 10:00 UTC | `0123456` | 36.00 | 48.00 (draft K=2) | 47.00 |")
    assert "| 30.00 (same minutes) | 1.20× | 1.60× | 1.33× |" in zen4
    assert zen3.startswith("| AMD Zen 3 | 2026-11-26 | `0123456` | 20.00 | 24.00 (draft K=2) |")
    assert "1.25× | 1.50× | 1.20× |" in zen3
    hist = [ln for ln in history.splitlines() if ln.startswith("| 2026")]
    assert [ln.split(" | ")[0] for ln in hist] == ["| 2026-11-28 10:00 UTC", "| 2026-11-27 10:00 UTC", "| 2026-11-26"]


def test_check_tells_a_stale_page_from_a_fresh_one(tmp_path):
    folder, page = tmp_path / "results", tmp_path / "results.md"
    results.save(folder, cpu_record("AMD Zen 4", "2026-11-27T10:00:00Z", 30.0, 40.0, 25.0))
    args = ["--results", str(folder), "--out", str(page)]
    assert render_results.main([*args, "--check"]) == 1  # no page yet
    assert render_results.main(args) == 0
    assert render_results.main([*args, "--check"]) == 0
    results.save(folder, cpu_record("AMD Zen 4", "2026-11-28T10:00:00Z", 36.0, 48.0, 30.0))  # a new run
    assert render_results.main([*args, "--check"]) == 1
    assert render_results.main(args) == 0 and "36.00" in page.read_text()


def test_speclens_bench_writes_one_record_of_its_figures(tmp_path, monkeypatch):
    """The main CLI's run ends in one record: the modes' figures, without their generated tokens."""
    import engine.io.provision
    import engine.tools.bench as bench_mod
    from tests.tiny import tiny_engine

    eng = tiny_engine()
    monkeypatch.setattr(engine.io.provision, "default_pair", lambda **kw: (tmp_path / "t", tmp_path / "d"))
    monkeypatch.setattr(bench_mod, "load_engine", lambda target, draft, device=None: eng)
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "hi"}]}))
    folder = tmp_path / "records"
    argv = ["--prompts", str(prompts), "--max-new-tokens", "4", "--modes", "plain,draft", "--results", str(folder)]
    assert bench_mod.main(argv) == 0
    assert bench_mod.main([*argv, "--no-record"]) == 0  # a trial run adds nothing
    [rec] = load_records(folder, warn=pytest.fail)
    assert rec.tool == "speclens-bench" and rec.args == argv and rec.figures["device"] == "cpu"
    assert [(r["mode"], r["k"]) for r in rec.figures["results"]] == [("plain", 0), ("draft", 4)]
    assert all("outputs" not in r and r["tokens_per_s"] > 0 for r in rec.figures["results"])


def test_imported_runs_of_one_day_keep_their_order_and_the_profiles_get_a_headline(tmp_path):
    """Imported records carry only their day: run b of a day comes after its unlettered run a, whatever the record
    files are called; a pass_bound record's line says the steps and the share of the peak the goals need."""
    later = cpu_record("AMD Zen 4", "2026-11-25", 30.0, 40.0, 25.0)
    later.source, later.imported, later.commit = "docs/bench_cpu_zen4_2026-11-25b.json", True, None
    first = cpu_record("AMD Zen 4", "2026-11-25", 20.0, 24.0, 16.0)
    first.source, first.imported, first.commit = "docs/bench_cpu_zen4_2026-11-25.json", True, None
    results.save(tmp_path, later)
    results.save(tmp_path, first)
    bound = Record(tool="scripts.profile.pass_bound", args=None, date="2026-11-28", commit=None, dirty=None,
                   machine={"kind": "AMD Zen 4"}, figures={"peak": {"gps": 449.0}, "moods": {"all": {
                       "step_ms": 24.84, "passes": {"5": {"steps": 1.99, "goal_needs_share": 0.55},
                                                    "9": {"steps": 3.46, "goal_needs_share": 0.78}}}}})
    results.save(tmp_path, bound)
    recs = load_records(tmp_path, warn=pytest.fail)
    assert [r.figures.get("ours", {}).get("plain", {}).get("tokens_per_s") for r in recs[:2]] == [20.0, 30.0]
    page = render_results.render(recs)
    assert "| AMD Zen 4 | 2026-11-25 | not recorded | 30.00 |" in page  # run b is the current one
    assert ("peak 449.00 G products/s; all: step 24.84 ms, 5 tokens 1.99 steps (goal needs 55%), 9 tokens 3.46 "
            "steps (goal needs 78%)") in page


def test_the_record_names_the_code_as_the_run_started(tmp_path, monkeypatch):
    """A commit made while a long benchmark runs is not the code that ran: the state is read with the arguments."""
    import argparse

    monkeypatch.setattr(results, "git_state", lambda: ("a" * 40, False))
    ap = argparse.ArgumentParser()
    results.add_arguments(ap)
    a = ap.parse_args(["--results", str(tmp_path)])
    monkeypatch.setattr(results, "git_state", lambda: ("b" * 40, True))  # committed and edited since
    path = results.record(a, "t", {"x": 1})
    rec = json.loads(path.read_text())
    assert (rec["commit"], rec["dirty"]) == ("a" * 40, False)
    later = write_record(tmp_path, "t", [], {}, cpu=parse_cpuinfo(ZEN3, 2))  # no state given: read now
    assert json.loads(later.read_text())["commit"] == "b" * 40
