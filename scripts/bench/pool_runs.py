"""The app's default against each fixed mode, kind by kind, pooled over recorded speclens-bench runs.

    python -m scripts.bench.pool_runs [--commits 91e9c97,e1cf5b3] [--results docs/results] [--markdown]

One run cannot say whether the default is behind a fixed mode on a kind: the same settings run twice in one run
(the default and hybrid K 4) differ by 2-9% on a kind, and the fastest of six noisy columns is luckier than any one
of them. Each recorded run is an independent draw, so the log of default / mode on a kind, averaged over runs, says
where a gap is systematic: its geometric mean, and the standard error of that mean (the runs' spread over the square
root of their number). Runs pool per machine kind, then all together; give the commits whose runs share a policy.
"""
from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.tools import results
from engine.tools.bench_report import mode_label

TOOL = "speclens-bench"


@dataclass(frozen=True)
class Pooled:
    runs: int
    ratio: float  # geometric mean of default / mode over the runs
    sd: float | None  # one run's spread of the log ratio (None with one run)

    @property
    def se(self) -> float | None:
        """The standard error of the mean log ratio, as a share."""
        return None if self.sd is None else self.sd / math.sqrt(self.runs)


def ratios(figures: dict) -> dict[str, dict[str, float]]:
    """Per kind, default / each fixed mode's decode rate in one speclens-bench run ({} without a default)."""
    by_label = {mode_label(e["mode"], e["k"]): e.get("categories") or {} for e in figures.get("results", [])}
    default = by_label.pop("default", None)
    by_label.pop("plain", None)
    out: dict[str, dict[str, float]] = {}
    for kind, row in (default or {}).items():
        for name, cats in by_label.items():
            mode = cats.get(kind, {}).get("tokens_per_s")
            if mode and row.get("tokens_per_s"):
                out.setdefault(kind, {})[name] = row["tokens_per_s"] / mode
    return out


def pool(runs: Iterable[dict[str, dict[str, float]]]) -> dict[str, dict[str, Pooled]]:
    logs: dict[str, dict[str, list[float]]] = {}
    for run in runs:
        for kind, row in run.items():
            for name, r in row.items():
                logs.setdefault(kind, {}).setdefault(name, []).append(math.log(r))
    out: dict[str, dict[str, Pooled]] = {}
    for kind, row in sorted(logs.items()):
        for name, v in sorted(row.items()):
            out.setdefault(kind, {})[name] = Pooled(len(v), math.exp(statistics.fmean(v)),
                                                    statistics.stdev(v) if len(v) > 1 else None)
    return out


def lowest(row: dict[str, Pooled]) -> str:
    """The fixed mode the default does worst against on a kind."""
    return min(row, key=lambda name: row[name].ratio)


def select(records: Sequence[results.Record], commits: Sequence[str]) -> list[results.Record]:
    """speclens-bench runs with a default, at one of `commits` (prefixes; all when empty) and with clean trees."""
    def at(rec: results.Record) -> bool:
        return not commits or any((rec.commit or "").startswith(c) for c in commits)

    def has_default(rec: results.Record) -> bool:
        return any(e.get("mode") == "default" for e in rec.figures.get("results", []))

    return [r for r in records if r.tool == TOOL and at(r) and r.dirty is False and has_default(r)]


def table(pooled: dict[str, dict[str, Pooled]]) -> list[str]:
    lines = []
    for kind, row in pooled.items():
        cells = [f"{name} {p.ratio:.3f}" + (f"\u00b1{p.se:.3f}" if p.se is not None else "") for name, p in row.items()]
        rival = lowest(row)
        p = row[rival]
        lines.append(f"{kind:15s} n={p.runs:<3d} lowest: {rival} {p.ratio:.3f} | " + "  ".join(cells))
    return lines


def markdown(pooled: dict[str, dict[str, Pooled]]) -> list[str]:
    """The pooled ratios as a docs table: a row per kind, a column per fixed mode, each kind's lowest in bold."""
    modes = sorted({name for row in pooled.values() for name in row})
    lines = ["| kind | " + " | ".join(modes) + " |", "| --- |" + " ---: |" * len(modes)]
    for kind, row in pooled.items():
        worst = lowest(row)
        cells = []
        for name in modes:
            p = row.get(name)
            cell = "" if p is None else f"{p.ratio:.3f}" + (f" \u00b1 {p.se:.3f}" if p.se is not None else "")
            cells.append(f"**{cell}**" if name == worst else cell)
        lines.append(f"| {kind} | " + " | ".join(cells) + " |")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", default=str(results.REPO / "docs" / "results"), help="the records' folder")
    ap.add_argument("--commits", default="", help="commit prefixes whose runs to pool, comma-separated (all: empty)")
    ap.add_argument("--markdown", action="store_true", help="tables as in docs/performance.md")
    a = ap.parse_args(argv)
    records = select(results.load_records(Path(a.results)), [c for c in a.commits.split(",") if c])
    if not records:
        ap.error("no clean speclens-bench run with a default among the records asked for")
    groups: dict[str, list[results.Record]] = {}
    for r in records:
        groups.setdefault(r.machine.get("kind", "?"), []).append(r)
    if len(groups) > 1:
        groups["all machine kinds"] = records
    for name, recs in groups.items():
        commits = ", ".join(sorted({(r.commit or "?")[:7] for r in recs}))
        print(f"{name}: {len(recs)} runs ({commits}); default / mode, geometric mean \u00b1 standard error")
        pooled = pool(ratios(r.figures) for r in recs)
        print("\n".join(markdown(pooled) if a.markdown else table(pooled)))


if __name__ == "__main__":
    main()
