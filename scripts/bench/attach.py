"""Our local engine beside an attached llama-server, on the same prompts, models and machine (the README's table).

    python -m scripts.bench.attach [--limit 4] [--max-new-tokens 64] [--out FILE]

Runs `speclens-bench` on the embedded pair (modes plain and draft, K = 4, greedy), then starts two llama-servers
through ../shared/bench/llama_server.sh with the same GGUF files (one with the draft: draft-simple, K = 4; one
plain) and runs `speclens-bench --server ... --plain-server ...` on the same prompts. Both JSON outputs go into
the run's record in docs/results/ (and --out where given); the tables are printed. Run it alone on the machine
(benchjob): the two sides are timed one after the other.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from engine.tools import results

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ROOT.parent / "shared" / "bench" / "prompts.jsonl"


def bench(args: list[str], out: Path) -> dict:
    cmd = [sys.executable, "-m", "engine.tools.bench", *args, "--json", str(out), "--no-record"]  # ours has both
    run = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=3600)
    print(run.stdout, run.stderr[-2000:], sep="\n", flush=True)
    if run.returncode != 0:
        raise SystemExit(f"speclens-bench failed ({run.returncode})")
    return json.loads(out.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=4, help="the first N prompts of shared/bench/prompts.jsonl")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--out", help="also write both JSON outputs here")
    results.add_arguments(ap)
    a = ap.parse_args()
    from engine.io.provision import DRAFT, TARGET, model_file
    from scripts.fixtures.record_llama_stream import free_port, start_server, wait_ready

    tmp = Path(tempfile.mkdtemp())
    prompts = tmp / "prompts.jsonl"
    prompts.write_text("".join(PROMPTS.read_text().splitlines(keepends=True)[: a.limit]))
    common = ["--prompts", str(prompts), "--max-new-tokens", str(a.max_new_tokens), "--temperature", "0"]
    local = bench([*common, "--modes", "plain,draft", "--k", "4"], tmp / "local.json")
    servers = []
    try:
        for kind in ("spec", "plain"):
            port = free_port()
            proc = start_server(kind, model_file(TARGET), model_file(DRAFT), port)
            servers.append((proc, f"http://127.0.0.1:{port}"))
        for proc, url in servers:
            wait_ready(url, proc)
        remote = bench([*common, "--server", servers[0][1], "--plain-server", servers[1][1], "--modes",
                        "plain,draft"], tmp / "remote.json")
    finally:
        for proc, _ in servers:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
    figures = {"local": local, "llama_server": remote}
    if a.out:
        Path(a.out).write_text(json.dumps(figures, indent=1) + "\n")
    results.record(a, "scripts.bench.attach", figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
