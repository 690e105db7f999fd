"""speclens-bench's attach mode (`--server URL [--plain-server URL2]`), kept apart from the local benchmark so that
it imports no model code. engine/remote/bench.py does the runs; this checks the arguments and writes the output."""
from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path

from engine.api.config import SamplingParams
from engine.remote.bench import ServerResult, run_server_mode, say, table
from engine.remote.client import KEY_ENV, ServerClient
from engine.remote.errors import RemoteError

SERVER_MODES = ("plain", "draft")


def main_server(a: argparse.Namespace, read_prompts: Callable, check_writable: Callable, fail: Callable) -> int:
    """Every argument is checked before the first request, as for a local run."""
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if a.modes == "plain,draft,ngram":  # the local default: on a server, what it can run
        modes = ["plain", "draft"] if a.plain_server else ["draft"]
    wrong = [m for m in modes if m not in SERVER_MODES]
    if wrong:
        fail(f"mode(s) {wrong} cannot run on a server: choose from {', '.join(SERVER_MODES)}")
    if "draft" in modes and not a.server:
        fail("mode draft needs --server (the speculative server)")
    if "plain" in modes and not a.plain_server:
        fail("mode plain needs --plain-server: a server's speculation is a start-up flag, so the plain baseline is "
             "a second server with the same model and no draft")
    if a.k != "4" or a.target or a.draft or a.device:
        fail("--k, --target, --draft and --device are the server's own start-up settings: leave them out with "
             "--server")
    try:
        sampling = SamplingParams(temperature=a.temperature, top_p=a.top_p, max_new_tokens=a.max_new_tokens,
                                  seed=a.seed)
    except ValueError as e:
        fail(f"bad sampling settings: {e}")
    prompts = [p["messages"] for p in read_prompts(a.prompts)]
    if a.json_out:
        check_writable(a.json_out)
    key = os.environ.get(KEY_ENV) or None
    try:
        clients = {m: ServerClient(a.server if m == "draft" else a.plain_server, key) for m in modes}
        for m, c in clients.items():
            info = c.probe()
            say(f"{m}: {info.label}, model {info.model}" + (f", K {info.k}" if info.k and m == "draft" else ""))
            for note in info.notes:
                say(f"  note: {note}")
        results: list[ServerResult] = []
        for m in modes:
            results.append(run_server_mode(clients[m], prompts, m, sampling))
            say(f"  {m}: {results[-1].tokens_per_s:.2f} tok/s")
    except RemoteError as e:
        fail(str(e))
    print(table(results))
    _warn_no_drafting(results)
    if a.json_out:
        infos = {m: c.info for m, c in clients.items()}
        out = {"device": "remote", "servers": {m: {"url": i.url, "kind": i.kind, "version": i.version,
                                                    "models": list(i.models), "draft": i.draft_model}
                                               for m, i in infos.items() if i is not None},
               "results": [asdict(r) for r in results]}
        Path(a.json_out).write_text(json.dumps(out, indent=1), encoding="utf-8")
    mismatched = [r for r in results if r.matches_metrics is False]
    if mismatched:
        say("the rebuilt rounds' totals differ from the server's /metrics (was another client using it?)")
        return 1
    return 0


def _warn_no_drafting(results: list[ServerResult]) -> None:
    for r in results:
        if r.mode == "draft" and r.new_tokens and not r.drafted_tokens:
            say(f"{r.server} drafted nothing: a llama-server started with a draft model but without "
                "--spec-type draft-simple loads the draft and never drafts")
