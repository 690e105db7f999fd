"""Benchmark results as data: every benchmark run writes one JSON record (the machine, the date, the commit, the
tool and its arguments, the figures) into one folder, docs/results/, and docs/results.md is rendered from those
records (scripts/bench/render_results.py). No Qt and no torch at import: the renderer and the tests read records
without loading a model, and a CUDA run asks torch for its GPU's name only when it writes.

A record's file name, `<date>_<tool>_<kind>_<commit>[_n].json`, sorts by date and says at a glance which machine
kind and build it measured; the contents are what the renderer reads."""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, is_dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # engine.cpu's package imports torch: machine() reads the CPU only when a record is written
    from engine.cpu.machine import Cpu

SCHEMA = 1  # raised when a field changes meaning; load_records skips records of a newer schema than it knows
REPO = Path(__file__).resolve().parents[2]
ENV = "SPECLENS_RESULTS"  # a folder that replaces the default one, or "off": no record (the test suite sets this)

# AMD family 25 (0x19) holds Zen 3 and Zen 4; these model ranges are Zen 4 (Genoa, Raphael, Phoenix, ...), the rest
# Zen 3 (Milan, Vermeer, Cezanne, ...). The kernels' tile choice differs between the two, so the label must not merge
# them.
ZEN4_MODELS = (range(0x10, 0x20), range(0x60, 0x80), range(0xA0, 0xB0))


@dataclass
class Record:
    tool: str  # "scripts.bench.cpu", "speclens-bench", ...
    args: list[str] | None  # the command line after the tool's name; None where not known (imported records)
    date: str  # UTC, ISO 8601 ("2026-11-28T14:03:11Z"); an imported record may carry only the day
    commit: str | None  # the checkout's HEAD, "unknown" when git could not say, None when not known (imported)
    dirty: bool | None  # whether tracked files differed from that commit
    machine: dict  # machine(): name, family, model, flags, logical, kind, cpu_kind, gpu
    figures: dict  # what the tool printed, as numbers
    imported: bool = False  # converted from an output that predates these records: only what it held is filled in
    source: str | None = None  # imported: the file it was converted from (git history keeps it)
    log: str | None = None  # a raw log kept beside the record, by file name in the same folder
    schema: int = SCHEMA
    path: Path | None = field(default=None, compare=False)  # where it was read from; not written

    def to_dict(self) -> dict:
        d = asdict(self)
        del d["path"]
        return {"schema": d.pop("schema"), **d}

    @classmethod
    def from_dict(cls, d: object, path: Path | None = None) -> Record:
        """The record that d describes; ValueError naming the first thing wrong with it."""
        if not isinstance(d, dict):
            raise ValueError(f"not a JSON object but a {type(d).__name__}")
        schema = d.get("schema")
        if not isinstance(schema, int) or isinstance(schema, bool):
            raise ValueError("no integer 'schema'")
        if schema > SCHEMA:
            raise ValueError(f"schema {schema} is newer than this reader's {SCHEMA}")
        checks = {"tool": (str,), "date": (str,), "machine": (dict,), "figures": (dict,),
                  "args": (list, type(None)), "commit": (str, type(None)), "dirty": (bool, type(None)),
                  "imported": (bool,), "source": (str, type(None)), "log": (str, type(None))}
        for key, types in checks.items():
            if key not in d:
                raise ValueError(f"no '{key}'")
            if not isinstance(d[key], types):
                raise ValueError(f"'{key}' is a {type(d[key]).__name__}")
        if not d["tool"] or not d["date"]:
            raise ValueError("empty 'tool' or 'date'")
        if not isinstance(d["machine"].get("kind"), str) or not d["machine"]["kind"]:
            raise ValueError("the machine has no 'kind'")
        try:
            datetime.fromisoformat(d["date"].replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"'date' {d['date']!r} is not ISO 8601") from None
        if d["args"] is not None and not all(isinstance(x, str) for x in d["args"]):
            raise ValueError("'args' holds something other than strings")
        unknown = set(d) - {f for f in cls.__dataclass_fields__ if f != "path"}
        if unknown:
            raise ValueError(f"unknown field(s) {sorted(unknown)}")
        return cls(**{k: d[k] for k in checks}, schema=schema, path=path)

    @property
    def kind(self) -> str:
        return self.machine["kind"]


def cpu_kind(cpu: Cpu) -> str:
    """A label for the kind of CPU, fine enough that runs on two machines of one label can be compared: AMD by Zen
    generation (from family and model), Intel by family and model plus the dot instructions it has (the kernels'
    choice turns on them), anything else by its name, family and model."""
    try:
        family, model = int(cpu.family), int(cpu.model)
    except ValueError:
        family = model = None
    if "AMD" in cpu.name.upper():
        if family == 25:
            return "AMD Zen 4" if any(model in r for r in ZEN4_MODELS) else "AMD Zen 3"
        if family == 26:
            return "AMD Zen 5"
        if family == 23:
            return "AMD Zen 2 or earlier (family 23)"
        return f"AMD family {cpu.family} model {cpu.model}"
    if "INTEL" in cpu.name.upper():
        dots = []
        if "avx512f" in cpu.flags:
            dots.append("AVX-512 VNNI" if "avx512_vnni" in cpu.flags else "AVX-512")
        if "avx_vnni" in cpu.flags:
            dots.append("AVX-VNNI")
        if not dots and "avx2" in cpu.flags:
            dots.append("AVX2")
        return f"Intel family {cpu.family} model {cpu.model}" + (f" ({' + '.join(dots)})" if dots else "")
    return f"{cpu.name} (family {cpu.family} model {cpu.model})"


def gpu_name(device: str | None) -> str | None:
    """The CUDA device's name when the run used one (torch imported only then)."""
    if not device or not str(device).startswith("cuda"):
        return None
    try:
        import torch

        return torch.cuda.get_device_name(torch.device(device)) if torch.cuda.is_available() else None
    except (ImportError, RuntimeError, AssertionError):
        return None


def machine(cpu: Cpu | None = None, gpu: str | None = None) -> dict:
    """The machine part of a record. `kind` is what the results page groups by: the GPU's name on a CUDA run (the
    host CPU barely matters there), the CPU's kind otherwise."""
    if cpu is None:
        from engine.cpu.machine import this_cpu

        cpu = this_cpu()
    ck = cpu_kind(cpu)
    return {"name": cpu.name, "family": cpu.family, "model": cpu.model, "flags": cpu.simd, "logical": cpu.logical,
            "kind": gpu or ck, "cpu_kind": ck, "gpu": gpu}


def _git(*args: str) -> str | None:
    try:
        run = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):  # no git, or a git that hangs (a lock, a network mount)
        return None
    return run.stdout.strip() if run.returncode == 0 else None


def git_state() -> tuple[str, bool | None]:
    """(HEAD's commit or "unknown", whether tracked files differ from it or None when unknown). A benchmark never
    fails for want of git: its figures are worth keeping without a commit."""
    commit = _git("rev-parse", "HEAD")
    if not commit:
        return "unknown", None
    status = _git("status", "--porcelain", "--untracked-files=no")
    return commit, None if status is None else bool(status)


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "x"


def plain(obj: object) -> object:
    """obj as JSON data: dataclasses as dicts, paths and other objects as text, tuples and sets as lists, keys as
    text, and NaN or infinite floats as null (JSON has no such numbers; a strict reader would refuse the file)."""
    if is_dataclass(obj) and not isinstance(obj, type):
        obj = asdict(obj)
    if isinstance(obj, dict):
        return {str(k): plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [plain(v) for v in obj]
    if isinstance(obj, (set, frozenset)):
        return sorted(plain(v) for v in obj)
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if obj is None or isinstance(obj, (str, int, bool)):
        return obj
    return str(obj)


def file_name(rec: Record, n: int = 1) -> str:
    tool = slug(rec.tool.removeprefix("scripts."))
    short = (rec.commit or "unknown")[:10] if rec.commit != "unknown" else "unknown"
    return f"{rec.date[:10]}_{tool}_{slug(rec.kind)}_{short}" + (f"_{n}" if n > 1 else "") + ".json"


def save(folder: str | Path, rec: Record) -> Path:
    """rec written into folder under a name of its own; the file appears whole or not at all (written aside, then
    linked in under a name nothing holds, so two runs finishing together cannot overwrite each other)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    text = json.dumps(plain(rec.to_dict()), indent=1, allow_nan=False) + "\n"
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=".record-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        for n in range(1, 1000):
            path = folder / file_name(rec, n)
            try:
                os.link(tmp, path)
                return path
            except FileExistsError:
                continue
        raise OSError(f"no free record name in {folder} for {file_name(rec)}")
    finally:
        os.unlink(tmp)


def write_record(folder: str | Path, tool: str, args: Sequence[str] | None, figures: dict,
                 device: str | None = None, cpu: Cpu | None = None,
                 state: tuple[str, bool | None] | None = None) -> Path:
    """One run's record, written into folder; its path. state: git_state() when the run started (the code that
    ran; a commit made while a long benchmark ran is not it), else read now."""
    commit, dirty = state or git_state()
    rec = Record(tool=tool, args=None if args is None else [str(a) for a in args],
                 date=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), commit=commit, dirty=dirty,
                 machine=machine(cpu, gpu_name(device)), figures=plain(figures))
    return save(folder, rec)


def load_records(folder: str | Path, warn: Callable[[str], None] | None = None) -> list[Record]:
    """Every record in folder, oldest first; a file that is not a valid record is skipped with one warning line
    (on stderr unless `warn` is given): one bad file must not hide the rest of the page."""
    warn = warn or (lambda line: print(line, file=sys.stderr))
    out = []
    for path in sorted(Path(folder).glob("*.json")):
        try:
            out.append(Record.from_dict(json.loads(path.read_text(encoding="utf-8")), path))
        except (OSError, UnicodeDecodeError, ValueError) as e:  # json.JSONDecodeError is a ValueError
            warn(f"results: skipped {path.name}: {e}")
    # an imported record may carry only its day: its source file's name (run a, b, ...) orders it within the day
    return sorted(out, key=lambda r: (r.date, r.source or "", r.path.name))


# --- the benchmarks' side: two options and one call -------------------------------------------------------------


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--results", metavar="DIR", default=None,
                    help=f"write this run's results record into DIR (default: docs/results in the checkout, or "
                         f"${ENV}; 'off' there writes none)")
    ap.add_argument("--no-record", action="store_true", help="a trial run: write no results record")
    ap.set_defaults(git_at_start=git_state())  # read as the run starts: the record names the code that ran


def default_folder() -> Path | None:
    """$SPECLENS_RESULTS, or docs/results in the checkout; None where records are off, or where the package runs
    installed rather than from a checkout (no docs/ beside it)."""
    env = os.environ.get(ENV)
    if env is not None:
        return None if env.strip().lower() in ("", "off", "0", "no") else Path(env)
    return REPO / "docs" / "results" if (REPO / "docs").is_dir() else None


def record(a: argparse.Namespace, tool: str, figures: dict, argv: Sequence[str] | None = None,
           device: str | None = None) -> Path | None:
    """The run's record, as the options in `a` (add_arguments) ask; its path, or None when none was written. A
    folder that cannot be written costs a warning, not the run: the figures have been printed already."""
    if getattr(a, "no_record", False):
        return None
    folder = Path(a.results) if getattr(a, "results", None) else default_folder()
    if folder is None:
        return None
    try:
        path = write_record(folder, tool, sys.argv[1:] if argv is None else argv, figures, device,
                            state=getattr(a, "git_at_start", None))
    except OSError as e:
        print(f"results record not written: {e}", file=sys.stderr)
        return None
    print(f"results record: {path}", file=sys.stderr)
    return path
