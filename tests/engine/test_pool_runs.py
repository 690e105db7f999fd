"""scripts/bench/pool_runs.py: default / each fixed mode per kind, pooled over recorded runs as a geometric mean with
its standard error; only clean speclens-bench runs at the asked commits count."""
import json
import math

import pytest

from engine.tools.results import Record
from scripts.bench.pool_runs import main, markdown, pool, ratios, select, table


def run(default: float, draft: float, commit: str = "abc1234", tool: str = "speclens-bench", dirty: bool = False,
        kind: str = "AMD Zen 4") -> Record:
    def entry(mode, k, rate):
        return {"mode": mode, "k": k, "categories": {"qa": {"tokens_per_s": rate}, "rag": {"tokens_per_s": 20.0}}}

    figures = {"results": [entry("plain", 0, 10.0), entry("draft", 2, draft), entry("default", 4, default)]}
    return Record(tool=tool, args=[], date="2026-12-03T08:00:00Z", commit=commit, dirty=dirty,
                  machine={"kind": kind}, figures=figures)


def test_one_run_gives_default_over_each_fixed_mode_by_kind_leaving_plain_out():
    assert ratios(run(30.0, 25.0).figures) == {"qa": {"draft K=2": pytest.approx(1.2)}, "rag": {"draft K=2": 1.0}}
    no_default = {"results": [{"mode": "draft", "k": 2, "categories": {"qa": {"tokens_per_s": 5.0}}}]}
    assert ratios(no_default) == {}


def test_runs_pool_as_a_geometric_mean_with_its_standard_error():
    pooled = pool([ratios(run(27.0, 30.0).figures), ratios(run(33.0, 30.0).figures)])
    qa = pooled["qa"]["draft K=2"]
    logs = [math.log(0.9), math.log(1.1)]
    assert qa.runs == 2
    assert qa.ratio == pytest.approx(math.sqrt(0.9 * 1.1))
    assert qa.sd == pytest.approx(abs(logs[0] - logs[1]) / math.sqrt(2))
    assert qa.se == pytest.approx(qa.sd / math.sqrt(2))
    assert pool([ratios(run(27.0, 30.0).figures)])["qa"]["draft K=2"].se is None
    assert table(pooled)[1].startswith("rag") and "lowest: draft K=2 1.000" in table(pooled)[1]


def test_only_clean_speclens_bench_runs_at_the_asked_commits_are_pooled():
    records = [run(30.0, 25.0, "abc1234"), run(30.0, 25.0, "def5678"), run(30.0, 25.0, dirty=True),
               run(30.0, 25.0, tool="scripts.bench.cpu")]
    assert select(records, []) == records[:2]
    assert select(records, ["def"]) == [records[1]]


def test_the_command_prints_each_machine_kind_then_all(tmp_path, capsys):
    for i, (kind, default) in enumerate((("AMD Zen 3", 27.0), ("AMD Zen 4", 33.0))):
        rec = run(default, 30.0, kind=kind)
        (tmp_path / f"r{i}.json").write_text(json.dumps(rec.to_dict()))
    main(["--results", str(tmp_path)])
    out = capsys.readouterr().out
    assert "AMD Zen 3: 1 runs" in out and "AMD Zen 4: 1 runs" in out and "all machine kinds: 2 runs" in out
    assert f"lowest: draft K=2 {math.sqrt(0.9 * 1.1):.3f}" in out
    with pytest.raises(SystemExit):
        main(["--results", str(tmp_path), "--commits", "fff"])


def test_the_docs_table_bolds_each_kinds_lowest_ratio():
    pooled = pool([ratios(run(27.0, 30.0).figures), ratios(run(33.0, 30.0).figures)])
    lines = markdown(pooled)
    assert lines[0] == "| kind | draft K=2 |" and lines[1] == "| --- | ---: |"
    qa = pooled["qa"]["draft K=2"]
    assert lines[2] == f"| qa | **{qa.ratio:.3f} \u00b1 {qa.se:.3f}** |"
    assert lines[3] == "| rag | **1.000 \u00b1 0.000** |"
