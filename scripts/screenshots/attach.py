"""The window attached to real llama-servers under Xvfb (how docs/images/attach.png was made).

    Xvfb :99 -screen 0 1480x900x24 &
    DISPLAY=:99 SHOT=docs/images/attach.png python -m scripts.screenshots.attach light

Starts two llama-servers on 127.0.0.1 through ../shared/bench/llama_server.sh with the embedded pair (one with the
draft, K = 4; one plain), attaches the window to them (File > Attach to server, as `speclens --attach URL
--plain-server URL2` does), sends a greedy prompt, runs Compare, then sends a second prompt and grabs the screen
mid-reply. Prints the Compare verdict and both replies' figures; with CSV set, exports the session there.
"""
import functools
import os
import signal
import sys
import time

from scripts.screenshots import xvfb_window


def main() -> int:
    from engine.io.provision import DRAFT, TARGET, model_file
    from scripts.fixtures.record_llama_stream import free_port, start_server, wait_ready

    target, draft = model_file(TARGET), model_file(DRAFT)
    servers = []
    for kind in ("spec", "plain"):
        port = free_port()
        proc = start_server(kind, target, draft, port)
        servers.append((proc, f"http://127.0.0.1:{port}"))
    try:
        for proc, url in servers:
            wait_ready(url, proc)
        return shoot(servers[0][1], servers[1][1])
    finally:
        for proc, _ in servers:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)


def shoot(url: str, plain_url: str) -> int:
    from engine.remote.client import ServerClient

    counters = ServerClient(url)
    counters.probe()
    before = counters.counters()
    qa, controller, w = xvfb_window.open_window()
    wait = xvfb_window.wait
    wait_until = functools.partial(xvfb_window.wait_until, timeout=900)
    idle = functools.partial(xvfb_window.idle, controller, w)
    w.attach_mode.attach(url, plain_url)
    wait_until(lambda: controller.remote is not None or controller.connecting is None)
    if controller.remote is None:
        return 1
    print("attached", controller.info, flush=True)
    w.controls.max_tokens_spin.setValue(int(os.environ.get("N1", "60")))
    w.controls.temp_slider.setValue(0)
    w.input.setPlainText("Write a Python function that returns the n-th Fibonacci number iteratively, with a "
                         "docstring and type hints.")
    w.send()
    record = controller.active.record
    wait_until(idle)
    report("turn1", record.summary)
    dlg = w.compare()
    wait_until(lambda: not dlg.running)
    wait(300)
    dlg.grab().save(os.environ.get("CMP", "/tmp/speclens-attach-compare.png"))
    print("compare", dlg.verdict and dlg.verdict.text, flush=True)
    dlg.close()
    wait_until(idle)
    w.controls.max_tokens_spin.setValue(int(os.environ.get("N2", "120")))
    w.input.setPlainText("Now explain, in a short paragraph, why the iterative version is faster than the naive "
                         "recursive one.")
    w.send()
    record = controller.active.record
    wait_until(lambda: record.rounds and record.rounds[-1].new_tokens >= int(os.environ.get("SHOT_AT", "50")))
    wait(400)
    qa.primaryScreen().grabWindow(0).save(os.environ.get("SHOT", "/tmp/speclens-attach.png"))
    print("shot taken", flush=True)
    wait_until(idle)
    report("turn2", record.summary)
    if os.environ.get("CSV"):  # its drafted / accepted totals against the server's own /metrics over the session
        w.export_stats(os.environ["CSV"])
        import csv

        with open(os.environ["CSV"], newline="", encoding="utf-8") as f:
            rows = [r for r in csv.DictReader(f) if r["kind"] != "compare-plain"]
        d = counters.counters().minus(before)
        print(f"CSV: drafted {sum(int(r['drafted']) for r in rows)}, accepted {sum(int(r['accepted']) for r in rows)}; "
              f"/metrics delta: drafted {d.draft_tokens}, accepted {d.accepted_tokens}, drafts {d.drafts}", flush=True)
    w.close()
    controller.shutdown()
    return 0


def report(name: str, s) -> None:
    print(name, s.new_tokens, "tok", f"{s.tokens_per_s:.2f} tok/s", f"drafted {s.drafted} accepted {s.accepted}",
          f"acc {s.acceptance_rate:.2f}", flush=True)


if __name__ == "__main__":
    t0 = time.time()
    code = main()
    print(f"{time.time() - t0:.0f} s", flush=True)
    sys.exit(code)
