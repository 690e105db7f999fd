#!/usr/bin/env python
"""How much does the GUI slow generation down? Decode rate with and without the window repainting.

Both variants run the same requests through the same engine process (app/host.py); "headless" only counts the
host's signals, "gui" streams them into a shown MainWindow (chat + charts repainting from their timer, the inspector dock open). The
engine has a process of its own, so what the window can still cost it is CPU time on a machine with few cores.
The runs alternate, after one warm-up each, and greedy decoding makes every run produce the same
tokens. Reported: median decode tokens/s (Summary.tokens_per_s) per variant and the overhead
1 - gui/headless, and the GUI process's own CPU time per second of wall time (what it can take from the
engine's cores, steadier than the rates on a shared machine). Exit status 1 when the overhead exceeds --max-overhead percent.

    python -m scripts.bench.gui_overhead --target T --draft D   # real models (folders, .gguf or cached repo ids)
    python -m scripts.bench.gui_overhead --embedded             # the embedded default pair
    python -m scripts.bench.gui_overhead --tiny                 # tiny random models built in-process (default)
    python -m scripts.bench.gui_overhead --fake                 # the scripted engine of the app tests (no torch)

Qt runs offscreen unless --show (or QT_QPA_PLATFORM is set): painting still happens, into offscreen buffers.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from engine.api.config import DRAFTERS
from engine.tools import results as records  # main's `results` is its rates

ROOT = Path(__file__).resolve().parents[2]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    src = ap.add_mutually_exclusive_group()
    src.add_argument("--target", help="target model (with optional --draft)")
    src.add_argument("--embedded", action="store_true", help="the embedded default pair")
    src.add_argument("--tiny", action="store_true", help="tiny random Llama pair built in-process (default)")
    src.add_argument("--fake", action="store_true", help="the scripted fake engine from tests/app_fixtures.py")
    ap.add_argument("--draft")
    ap.add_argument("--device")
    ap.add_argument("--runs", type=int, default=3, help="measured runs per variant (default 3)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--drafter", choices=DRAFTERS, default=None,
                    help="default: the app's (hybrid) when there is a draft model, else ngram")
    ap.add_argument("--prompt", default="Write a Python function that returns the n-th Fibonacci number "
                    "iteratively, with a docstring and type hints.")
    ap.add_argument("--max-overhead", type=float, default=5.0, help="percent; exit 1 above it (default 5)")
    ap.add_argument("--show", action="store_true", help="use the real display instead of offscreen")
    ap.add_argument("--json", type=Path, help="also write the results here")
    records.add_arguments(ap)
    return ap.parse_args(argv)


def make_loader(args: argparse.Namespace):
    """(engine-process loader, description)."""
    from engine.service.loaders import DEFAULT_LOADER, Factory

    if args.fake:
        from tests.app_fixtures import CODE_REPLY

        return (Factory("tests.app_fixtures:fake_loader", {"script": CODE_REPLY * 4, "work_ms": 4.0}),
                "scripted fake engine (4 ms numpy work/round)")
    if args.target or args.embedded:
        return DEFAULT_LOADER, (args.target or "the embedded pair")
    return (Factory("tests.app_fixtures:tiny_loader", {"max_seq_len": 512}),
            "tiny random Llama pair (tests/tiny.py), one thread")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.show:
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import QEventLoop, QSettings, QTimer
    from PySide6.QtWidgets import QApplication

    from app.controller import ChatController
    from app.host import EngineHost
    from app.views.window import MainWindow
    from engine.api.config import APP_DEFAULTS
    from engine.service.loaders import Factory

    qapp = QApplication.instance() or QApplication([])
    qapp.setStyle("Fusion")
    loader, what = make_loader(args)
    host = EngineHost(loader, Factory("tests.app_fixtures:listed_models"))
    controller = ChatController(host)
    controller.load(args.target, args.draft, args.device)
    t = time.perf_counter()
    while controller.loading:
        loop = QEventLoop()
        QTimer.singleShot(20, loop.quit)
        loop.exec()
    if not controller.ready:
        print("the engine did not load", file=sys.stderr)
        return 1
    what += f" ({time.perf_counter() - t:.1f} s to a loaded engine)"
    drafter = args.drafter or (APP_DEFAULTS.drafter if host.info.draft_name else "ngram")
    messages = [{"role": "user", "content": args.prompt}]

    settings = QSettings(str(Path(os.environ.get("TMPDIR", "/tmp")) / "speclens-bench.ini"), QSettings.Format.IniFormat)
    window = MainWindow(controller, settings)
    window.resize(1480, 900)
    window.controls.k_slider.setValue(args.k)
    window.controls.temp_slider.setValue(0)
    window.controls.max_tokens_spin.setValue(args.max_new_tokens)
    window.controls.seed_spin.setValue(0)
    window.controls.drafter_combo.setCurrentIndex(window.controls.drafter_combo.findData(drafter))
    window.show()
    window.inspector.show()  # the dock open, as the step-cost goal has it (the engine records its rows either way)
    # headless sends exactly what the window sends (the app's defaults, e.g. its early draft stop, included)
    sampling, spec = window.controls.sampling_params(), window.controls.spec_params()
    assert sampling.temperature == 0.0 and spec.k == args.k and spec.drafter == drafter

    def wait_idle() -> None:
        # The rates are the engine's own (Summary.tokens_per_s), so a coarse poll loses nothing; at 5 ms this loop
        # took ~5% of a core from the engine in both variants (the app itself never polls)
        while host.busy or controller.busy or window.frame_timer.isActive():
            loop = QEventLoop()
            QTimer.singleShot(50, loop.quit)
            loop.exec()

    def headless() -> object:
        host.reset()
        summaries: list[object] = []
        host.generate(messages, sampling, spec).summary.connect(summaries.append)
        wait_idle()
        return summaries[0]

    def gui() -> object:
        window.new_chat()
        window.input.setPlainText(args.prompt)
        window.send()
        record = controller.active.record
        wait_idle()
        return record.summary

    results: dict[str, list[float]] = {"headless": [], "gui": []}
    gui_cpu: dict[str, list[float]] = {"headless": [], "gui": []}  # this process's CPU time / wall time
    tokens: dict[str, set] = {"headless": set(), "gui": set()}
    print(f"engine: {what}; drafter {drafter}, K {args.k}, greedy, {args.max_new_tokens} new tokens")
    variants = (("headless", headless), ("gui", gui))
    for i in range(args.runs + 1):  # run 0 warms up both; the order alternates
        for name, run in variants if i % 2 == 0 else variants[::-1]:
            c0, w0 = time.process_time(), time.perf_counter()
            s = run()
            cpu = (time.process_time() - c0) / (time.perf_counter() - w0)
            tokens[name].add(s.new_tokens)
            if i:
                results[name].append(s.tokens_per_s)
                gui_cpu[name].append(cpu)
            print(f"  run {i}{' (warm-up)' if not i else ''} {name:8s} {s.tokens_per_s:8.2f} tok/s "
                  f"({s.new_tokens} tokens, {s.rounds} rounds, acceptance {s.acceptance_rate:.0%}); "
                  f"GUI process {cpu:.1%} of a core")
    if len(tokens["headless"] | tokens["gui"]) > 1:
        print(f"warning: runs produced different lengths {sorted(tokens['headless'] | tokens['gui'])}; "
              "tokens/s may not compare like with like")
    h, g = statistics.median(results["headless"]), statistics.median(results["gui"])
    overhead = 100.0 * (1.0 - g / h) if h > 0 else 0.0
    info = {
        "engine": what, "device": host.info.device, "platform": platform.platform(), "cpus": os.cpu_count(),
        "qt_platform": qapp.platformName(), "runs": args.runs, "max_new_tokens": args.max_new_tokens,
        "headless_tok_s": results["headless"], "gui_tok_s": results["gui"],
        "headless_median": h, "gui_median": g, "overhead_percent": overhead,
        "gui_process_cpu_headless": gui_cpu["headless"], "gui_process_cpu_gui": gui_cpu["gui"],
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    print(f"median decode rate: headless {h:.2f} tok/s, with GUI {g:.2f} tok/s -> overhead {overhead:+.1f}% "
          f"(limit {args.max_overhead}%)  [{info['platform']}, {info['cpus']} CPUs, Qt {info['qt_platform']}]")
    print(f"GUI process CPU (median, share of one core): {statistics.median(gui_cpu['headless']):.1%} headless, "
          f"{statistics.median(gui_cpu['gui']):.1%} with the window painting")
    if args.json:
        args.json.write_text(json.dumps(info, indent=2))
    records.record(args, "scripts.bench.gui_overhead", info, argv=argv, device=host.info.device)
    controller.shutdown()
    return 0 if overhead <= args.max_overhead else 1


if __name__ == "__main__":
    sys.exit(main())
