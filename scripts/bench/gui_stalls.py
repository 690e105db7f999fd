#!/usr/bin/env python
"""How long does the GUI thread stall while a reply streams? p50 / p99 / max of a 10 ms heartbeat's gaps.

The window runs as in the app: the engine in its own process (app/host.py), the GUI process without torch. A
QTimer ticks every 10 ms in the GUI thread; a gap between two ticks longer than 10 ms is time the thread spent
on other work (painting the chat, the charts, unpickling rounds, garbage collection) or waiting for a CPU. On
Linux that wait is known (/proc/thread-self/schedstat) and reported apart: other processes crowding a shared
machine are not the app stalling.

    python -m scripts.bench.gui_stalls                     # scripted engine, ~70 tok/s and a ~1,000 tok/s stress
    python -m scripts.bench.gui_stalls --embedded          # also the real embedded pair (loads in ~20 s, ~16 GB)
    python -m scripts.bench.gui_stalls --profile           # plus what each stall was made of (per-flush timings)

Qt runs offscreen unless --show: painting still happens, into offscreen buffers.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

from engine.cpu.machine import this_cpu
from engine.tools import results as records  # main's `results` is its cases'

ROOT = Path(__file__).resolve().parents[2]


def runqueue_wait_s() -> float:
    try:
        with open("/proc/thread-self/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def percentile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))] if s else 0.0


class Timings:
    """Durations of the GUI thread's named pieces of work, for --profile."""

    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = {}
        self.spans: list[tuple[float, float, str]] = []  # (start, end, label) in perf_counter seconds

    def wrap(self, obj, name: str, label: str) -> None:
        original = getattr(obj, name)

        def timed(*args, **kwargs):
            t = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                end = time.perf_counter()
                self.samples.setdefault(label, []).append((end - t) * 1e3)
                self.spans.append((t, end, label))

        setattr(obj, name, timed)

    def add(self, label: str, ms: float) -> None:
        self.samples.setdefault(label, []).append(ms)
        end = time.perf_counter()
        self.spans.append((end - ms / 1e3, end, label))

    def inside(self, t0: float, t1: float) -> str:
        """The timed work that ran between t0 and t1."""
        parts = [f"{label} {(min(e, t1) - max(s, t0)) * 1e3:.1f}" for s, e, label in self.spans if s < t1 and e > t0]
        return ", ".join(parts) or "nothing timed"

    def report(self) -> list[str]:
        rows = []
        for label, v in sorted(self.samples.items(), key=lambda kv: -max(kv[1])):
            rows.append(f"    {label:28s} n={len(v):5d}  p50 {percentile(v, 50):6.2f}  p99 {percentile(v, 99):6.2f}  "
                        f"max {max(v):6.2f} ms  total {sum(v) / 1e3:6.2f} s")
        return rows


def run_case(window, prompt: str, timeout_s: float, timings: Timings | None = None) -> dict:
    """Send `prompt`, beat every 10 ms while its rounds stream, return the gap statistics."""
    from PySide6.QtCore import QEventLoop, QTimer

    ticks: list[float] = []
    waits: list[float] = []
    timer = QTimer()
    timer.setInterval(10)
    timer.timeout.connect(lambda: (ticks.append(time.perf_counter()), waits.append(runqueue_wait_s())))
    c = window.controller
    window.input.setPlainText(prompt)
    window.send()
    record = c.active.record
    end = time.monotonic() + timeout_s

    def spin(until) -> None:
        while not until():
            if time.monotonic() > end:
                raise TimeoutError("the reply did not finish in time")
            loop = QEventLoop()
            QTimer.singleShot(5, loop.quit)
            loop.exec()

    spin(lambda: bool(record.rounds))  # past the prefill: now streaming
    timer.start()
    spin(lambda: not c.busy and not window.frame_timer.isActive())  # the window has painted it all
    timer.stop()
    raw = [(b - a) * 1e3 for a, b in zip(ticks, ticks[1:])]
    own = [g - (w1 - w0) * 1e3 for g, w0, w1 in zip(raw, waits, waits[1:])]
    if timings is not None:
        worst = sorted(range(len(own)), key=lambda i: -own[i])[:5]
        for i in worst:
            print(f"    stall {own[i]:6.1f} ms: {timings.inside(ticks[i], ticks[i + 1])}")
    s = record.summary
    return {"ticks": len(ticks), "rounds": len(record.rounds), "tokens": s.new_tokens if s else None,
            "tokens_per_s": s.tokens_per_s if s else None,
            "p50_ms": percentile(own, 50), "p99_ms": percentile(own, 99), "max_ms": max(own, default=0.0),
            "raw_p99_ms": percentile(raw, 99), "raw_max_ms": max(raw, default=0.0)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--embedded", action="store_true", help="also measure with the real embedded pair")
    ap.add_argument("--embedded-tokens", type=int, default=160, help="new tokens for the real pair (default 160)")
    ap.add_argument("--repeats", type=int, default=20, help="scripted reply length, in copies of a ~60-token "
                    "code answer (default 20)")
    ap.add_argument("--profile", action="store_true", help="time each flush and paint of the chat and charts")
    ap.add_argument("--no-gc-freeze", action="store_true", help="skip the gc.freeze() that app.main does once "
                    "the window is up (see the full-collection time this prints)")
    ap.add_argument("--show", action="store_true", help="the real display instead of offscreen")
    ap.add_argument("--json", type=Path, help="also write the results here")
    records.add_arguments(ap)
    args = ap.parse_args(argv)
    if not args.show:
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

    import gc

    from PySide6.QtCore import QEventLoop, QSettings, QTimer
    from PySide6.QtWidgets import QApplication

    from app.controller import ChatController
    from app.host import EngineHost
    from app.views.window import MainWindow
    from engine.service.loaders import Factory

    qapp = QApplication.instance() or QApplication([])
    qapp.setStyle("Fusion")
    print(f"CPU: {this_cpu().line()}")
    print(f"{platform.platform()}, Python {platform.python_version()}, Qt platform {qapp.platformName()}, "
          f"{time.strftime('%Y-%m-%d %H:%M')}")

    script_kw = {"script": "", "accept_pattern": (3, 1, 4, 0, 2, 4)}
    from tests.app_fixtures import CODE_REPLY

    script_kw["script"] = CODE_REPLY * args.repeats
    cases = [
        ("scripted ~70 tok/s (40 ms rounds)", Factory("tests.app_fixtures:fake_loader",
                                                     dict(script_kw, round_delay=0.04)), 8192),
        ("scripted stress ~1,000 tok/s (3 ms rounds)", Factory("tests.app_fixtures:fake_loader",
                                                              dict(script_kw, round_delay=0.003)), 8192),
    ]
    if args.embedded:
        cases.append(("embedded pair (1.5B + 0.5B, K 4, greedy)", Factory("engine.service.loaders:default_loader"),
                      args.embedded_tokens))

    results = {}
    for name, loader, max_tokens in cases:
        host = EngineHost(loader, Factory("tests.app_fixtures:listed_models"))
        controller = ChatController(host)
        settings = QSettings(str(Path(os.environ.get("TMPDIR", "/tmp")) / "speclens-stalls.ini"),
                             QSettings.Format.IniFormat)
        window = MainWindow(controller, settings)
        window.resize(1480, 900)
        window.controls.k_slider.setValue(4)
        window.controls.temp_slider.setValue(0)
        window.controls.max_tokens_spin.setValue(max_tokens)
        window.show()
        timings = Timings()
        if args.profile:
            timings.wrap(window.chat, "flush", "chat.flush (text layout)")
            timings.wrap(window.charts, "flush", "charts.flush (one plot)")
            timings.wrap(window, "repaint_frame", "repaint_frame (both)")
            timings.wrap(window.chat.viewport(), "repaint", "chat viewport repaint")
            window.charts.view._on_paint = lambda s, spend=window.charts.view._on_paint: (
                spend(s), timings.add("charts paintEvent", s * 1e3))
        if not args.no_gc_freeze:
            gc.freeze()
        gc_ms: list[float] = []
        gc_start = [0.0]

        def on_gc(phase, info, gc_ms=gc_ms, gc_start=gc_start):
            if phase == "start":
                gc_start[0] = time.perf_counter()
            else:
                gc_ms.append((time.perf_counter() - gc_start[0]) * 1e3)

        t = time.perf_counter()
        controller.load()
        while controller.loading:
            loop = QEventLoop()
            QTimer.singleShot(20, loop.quit)
            loop.exec()
        if not controller.ready:
            print(f"{name}: the engine did not load")
            return 1
        load_s = time.perf_counter() - t
        window.repaint_frame()
        gc.callbacks.append(on_gc)
        r = run_case(window, "Write a Python function that returns the n-th Fibonacci number.", 900,
                     timings if args.profile else None)
        gc.callbacks.remove(on_gc)
        r["gc_passes"], r["gc_max_ms"], r["load_s"] = len(gc_ms), max(gc_ms, default=0.0), load_s
        results[name] = r
        print(f"{name}: {r['rounds']} rounds, {r['tokens']} tokens at {r['tokens_per_s']:.1f} tok/s; GUI-thread "
              f"stalls p50 {r['p50_ms']:.1f} ms, p99 {r['p99_ms']:.1f} ms, max {r['max_ms']:.1f} ms "
              f"(with waits for a CPU: p99 {r['raw_p99_ms']:.1f}, max {r['raw_max_ms']:.1f}); {r['gc_passes']} GC "
              f"passes, longest {r['gc_max_ms']:.1f} ms", flush=True)
        if args.profile:
            print("\n".join(timings.report()), flush=True)
        window.close()
        controller.shutdown()
        window.deleteLater()
    t = time.perf_counter()
    gc.collect()  # what a full collection costs now, were one to run mid-reply
    full_gc_ms = (time.perf_counter() - t) * 1e3
    frozen = gc.get_freeze_count()
    print(f"a full garbage collection of the GUI process takes {full_gc_ms:.1f} ms ({len(gc.get_objects())} "
          f"tracked objects{f', {frozen} more frozen' if frozen else ''})")
    if args.json:
        args.json.write_text(json.dumps({"cpu": this_cpu().name, "flags": this_cpu().simd, "cpus": os.cpu_count(),
                                         "platform": platform.platform(), "date": time.strftime("%Y-%m-%d %H:%M"),
                                         "gc_freeze": not args.no_gc_freeze, "full_gc_ms": full_gc_ms, "results": results},
                                        indent=2))
    worst = max(r["max_ms"] for r in results.values())
    print(f"worst stall {worst:.1f} ms (goal: 50 ms)")
    records.record(args, "scripts.bench.gui_stalls", {"gc_freeze": not args.no_gc_freeze, "full_gc_ms": full_gc_ms,
                                                      "worst_stall_ms": worst, "results": results}, argv=argv)
    return 0


if __name__ == "__main__":
    sys.exit(main())
