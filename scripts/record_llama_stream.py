"""Record what a real llama-server streams, for tests/test_remote.py to replay (tests/data/remote/*.json).

    python scripts/record_llama_stream.py [--out tests/data/remote]

Starts llama-server through ../shared/bench/llama_server.sh on 127.0.0.1 with the embedded pair (the target and
draft GGUFs from the cache): once speculative (draft-simple, K = 4), once with the draft loaded but no
`--spec-type` (it never drafts), and records a few short greedy chat requests with `"timings_per_token": true`:
every SSE line as sent, and the server's /v1/models, /props, /slots and the speculation lines of /metrics before
and after each request. Small on purpose (a few dozen tokens a reply): the tests replay them byte for byte.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "bench"
CASES = {  # name -> (server, prompt, max_tokens[, extra request fields])
    "spec_code": ("spec", "Write a Python function that returns the n-th Fibonacci number iteratively.", 48),
    "spec_short_eos": ("spec", "Answer with one word: what colour is the sky on a clear day?", 32),
    "spec_length": ("spec", "List the numbers from 1 to 30, separated by commas.", 21),
    "spec_greeting": ("spec", "Say hello in one short sentence.", 32),
    "spec_yes": ("spec", "Is Python a programming language? Answer yes or no, in lower case.", 16),
    # a stop string met inside a round: the server ends the reply there, mid-round
    "spec_stop_midround": ("spec", "List the numbers from 1 to 30, separated by commas.", 40, {"stop": ["8,"]}),
    "nodraft_code": ("nodraft", "Write a Python function that returns the n-th Fibonacci number iteratively.", 24),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(kind: str, target: Path, draft: Path, port: int) -> subprocess.Popen:
    """spec: llama_server.sh with the draft (draft-simple, K = 4); plain: no draft; nodraft: the draft loaded but no
    --spec-type (such a server never drafts)."""
    if kind in ("spec", "plain"):
        cmd = [str(SHARED / "llama_server.sh"), str(target), str(draft) if kind == "spec" else "-", str(port)]
    else:
        binary = subprocess.run([str(SHARED / "llama_cpp_build.sh")], check=True, capture_output=True,
                                text=True).stdout.strip()
        cmd = [f"{binary}/llama-server", "-m", str(target), "-md", str(draft), "--host", "127.0.0.1", "--port",
               str(port), "-t", str(os.cpu_count() or 2), "-c", "4096", "--metrics"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)


def wait_ready(url: str, proc: subprocess.Popen, limit_s: float = 180.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"llama-server exited with status {proc.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=2).json().get("status") == "ok":
                return
        except (httpx.HTTPError, ValueError):
            pass
        time.sleep(0.5)
    raise SystemExit(f"llama-server at {url} not ready after {limit_s:.0f} s")


def spec_metrics(url: str) -> str:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return "\n".join(line for line in text.splitlines() if "spec_decode" in line) + "\n"


def record(url: str, prompt: str, max_tokens: int, extra: dict | None = None) -> dict:
    body = {"messages": [{"role": "user", "content": prompt}], "stream": True, "max_tokens": max_tokens,
            "temperature": 0.0, "seed": 0, "timings_per_token": True, **(extra or {})}
    before = spec_metrics(url)
    lines = []
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as r:
        status = r.status_code
        for line in r.iter_lines():
            lines.append(line)
    return {"request": body, "status": status, "lines": lines, "metrics_before": before,
            "metrics_after": spec_metrics(url)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "tests" / "data" / "remote"))
    ap.add_argument("--only", nargs="*", help="record just these cases")
    a = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    from engine.io.provision import DRAFT, TARGET, model_file

    target, draft = model_file(TARGET), model_file(DRAFT)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    for server in ("spec", "nodraft"):
        if a.only and not any(CASES[n][0] == server for n in a.only):
            continue
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        proc = start_server(server, target, draft, port)
        try:
            wait_ready(url, proc)
            meta = {"models": httpx.get(f"{url}/v1/models", timeout=10).json(),
                    "props": httpx.get(f"{url}/props", timeout=10).json(),
                    "slots": httpx.get(f"{url}/slots", timeout=10).json()}
            meta["props"].pop("chat_template", None)  # long, and nothing reads it
            for name, (kind, prompt, max_tokens, *extra) in CASES.items():
                if kind != server or (a.only and name not in a.only):
                    continue
                rec = {**meta, **record(url, prompt, max_tokens, *extra)}
                (out / f"{name}.json").write_text(json.dumps(rec, indent=1) + "\n", encoding="utf-8")
                print(f"{name}: {len(rec['lines'])} lines", flush=True)
        finally:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
