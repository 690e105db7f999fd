"""The repository's front door stays a front door: a short README whose links resolve, docs pages that are all
reachable, scripts that import each other as modules, and views that never build a backend."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")
CODE_DIRS = ("engine", "app", "tests", "scripts")


def _links(page: Path) -> list[str]:
    return [t for t in LINK.findall(page.read_text()) if "://" not in t and not t.startswith("mailto:")]


def _pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_readme_is_short():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 400, f"README.md has {len(lines)} lines; depth belongs in docs/"


def test_every_relative_link_resolves():
    broken = [f"{page.relative_to(ROOT)} -> {target}" for page in _pages() for target in _links(page)
              if not (page.parent / target).exists()]
    assert not broken, "\n".join(broken)


def test_every_docs_page_is_linked():
    linked = {(page.parent / t).resolve() for page in _pages() for t in _links(page)}
    orphans = [str(p.relative_to(ROOT)) for p in sorted((ROOT / "docs").rglob("*.md")) if p.resolve() not in linked]
    assert not orphans, f"docs pages no page links to: {orphans}"


def test_docs_top_holds_no_raw_logs():
    raw = [p.name for p in (ROOT / "docs").iterdir() if p.suffix in (".log", ".json")]
    assert not raw, f"raw run output at the top of docs/ (results go to docs/results/): {raw}"


def test_the_two_setup_commands_are_in_the_readme():
    text = (ROOT / "README.md").read_text()
    assert "./scripts/run-app.sh" in text and "./scripts/test.sh" in text
    assert "./scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


def test_scripts_top_level_holds_only_setup_helpers():
    python = sorted(p.name for p in (ROOT / "scripts").glob("*.py") if p.name != "__init__.py")
    assert python == ["install_state.py"], python


def test_nothing_edits_sys_path():
    edit = re.compile(r"sys\.path\.(insert|append)\(")
    offenders = [str(p.relative_to(ROOT)) for d in CODE_DIRS for p in (ROOT / d).rglob("*.py")
                 if p != Path(__file__) and edit.search(p.read_text())]
    assert not offenders, offenders


def test_no_comment_names_a_tracker_issue():
    pattern = re.compile(r"\b[Ii]ssue #?\d+\b")
    hits = [f"{p.relative_to(ROOT)}:{n}" for d in CODE_DIRS for p in (ROOT / d).rglob("*.py") if p != Path(__file__)
            for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert not hits, hits


def test_views_and_dialogs_build_no_backend():
    hits = [str(p.relative_to(ROOT)) for d in ("app/views", "app/dialogs") for p in (ROOT / d).rglob("*.py")
            if re.search(r"^\s*(from|import) engine\.remote", p.read_text(), re.M)]
    assert not hits, f"views/dialogs importing engine.remote: {hits}"
