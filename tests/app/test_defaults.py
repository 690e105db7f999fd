"""The app's defaults are defined once (engine.api.config.APP_DEFAULTS): the window starts with them, and
`speclens-bench --modes default` runs them, so a benchmark's "default" is what a user gets."""
from __future__ import annotations

import json
from types import SimpleNamespace

import engine.tools.bench as bench_mod
from engine.api.config import APP_DEFAULTS
from tests.app_fixtures import FakeEngine


def test_the_windows_initial_controls_are_the_app_defaults(make_window):
    w = make_window(load=False, show=False)
    assert w.controls.spec_params() == APP_DEFAULTS.spec_params()
    assert w.controls.sampling_params() == APP_DEFAULTS.sampling_params()


def test_bench_mode_default_runs_the_app_defaults(tmp_path, monkeypatch, capsys):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"id": "a", "messages": [{"role": "user", "content": "hi"}]}) + "\n",
                       encoding="utf-8")
    engine = FakeEngine()
    engine.device, engine.load_seconds = SimpleNamespace(type="cpu"), 0.0
    monkeypatch.setattr(bench_mod, "load", lambda target, draft, device: engine)
    ran = []
    run_interleaved = bench_mod.run_interleaved
    monkeypatch.setattr(bench_mod, "run_interleaved", lambda *a, **kw: ran.extend(run_interleaved(*a, **kw)) or ran)

    # --k, --stop-below and --adaptive shape the other modes; "default" is the app's, whatever they say
    assert bench_mod.main(["--prompts", str(prompts), "--modes", "default", "--k", "7,9", "--stop-below", "0.2",
                           "--adaptive"]) == 0
    assert bench_mod.mode_spec("default", 7, 0.2, True) == APP_DEFAULTS.spec_params()
    [result] = ran
    assert (result.mode, result.k, result.stop_below, result.adaptive) == (
        "default", APP_DEFAULTS.k, APP_DEFAULTS.stop_below, APP_DEFAULTS.adaptive)
    assert result.temperature == APP_DEFAULTS.temperature
    seen = engine.seen[-1]  # the last request's rounds: the warm-up runs plain
    assert (seen.k, seen.enabled, seen.drafter, seen.adaptive, seen.temperature, seen.top_p) == (
        APP_DEFAULTS.k, APP_DEFAULTS.speculative, APP_DEFAULTS.drafter, APP_DEFAULTS.adaptive,
        APP_DEFAULTS.temperature, APP_DEFAULTS.top_p)
    assert "default" in capsys.readouterr().out
