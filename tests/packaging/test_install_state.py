"""scripts/install_state.py: when the set-up scripts may skip pip (run-app.sh runs install.sh at every launch)."""
import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def state(tmp_path, monkeypatch):
    spec = importlib.util.spec_from_file_location("install_state", ROOT / "scripts" / "install_state.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    monkeypatch.setattr(mod, "STAMP", tmp_path / ".speclens-installed")
    return mod


def check(state, extras: str) -> int:
    return state.main(["install_state.py", "check", extras])


def test_nothing_recorded_means_install(state):
    assert check(state, "default-models") == 1


def test_recorded_extras_accumulate_for_one_source(state):
    assert state.main(["install_state.py", "record", "default-models"]) == 0
    assert check(state, "default-models") == 0
    assert check(state, "default-models,test") == 1  # test was never installed from here
    state.main(["install_state.py", "record", "default-models,test"])
    assert check(state, "default-models,test") == 0 and check(state, "default-models") == 0


def test_another_pyproject_or_checkout_means_install(state):
    state.main(["install_state.py", "record", "default-models"])
    note = json.loads(state.STAMP.read_text())
    note["source"]["pyproject"] = "0" * 64  # pyproject.toml changed since
    state.STAMP.write_text(json.dumps(note))
    assert check(state, "default-models") == 1
    state.main(["install_state.py", "record", "default-models"])
    note = json.loads(state.STAMP.read_text())
    note["source"]["checkout"] = "/elsewhere"
    state.STAMP.write_text(json.dumps(note))
    assert check(state, "default-models") == 1
    state.STAMP.write_text("not json")
    assert check(state, "default-models") == 1


def test_a_package_removed_since_means_install(state, monkeypatch):
    state.main(["install_state.py", "record", "default-models,test"])
    assert check(state, "default-models,test") == 0
    real = state.md.version

    def version(name):
        if name == "scipy":
            raise state.md.PackageNotFoundError(name)
        return real(name)

    monkeypatch.setattr(state.md, "version", version)
    assert state.missing("default-models,test") == ["scipy"]
    assert check(state, "default-models,test") == 1
    assert check(state, "default-models") == 0  # scipy comes with the test extra only
