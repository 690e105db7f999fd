#!/usr/bin/env python
"""How much does the GUI slow generation down? Decode rate with and without the window repainting.

Both variants run the same requests through the same EngineHost (worker thread, signals, GIL switch interval);
"headless" only counts the signals, "gui" streams them into a shown MainWindow (chat + charts repainting from
their timer). The runs alternate, after one warm-up each, and greedy decoding makes every run produce the same
tokens. Reported: median decode tokens/s (Summary.tokens_per_s) per variant and the overhead
1 - gui/headless. Exit status 1 when the overhead exceeds --max-overhead percent.

    python scripts/bench_gui_overhead.py --target T --draft D   # real models (folders, .gguf or cached repo ids)
    python scripts/bench_gui_overhead.py --embedded             # the embedded default pair
    python scripts/bench_gui_overhead.py --tiny                 # tiny random models built in-process (default)
    python scripts/bench_gui_overhead.py --fake                 # the scripted engine of the app tests (no torch)

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

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


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
    ap.add_argument("--drafter", choices=("model", "ngram"), default=None,
                    help="default: model when there is a draft model, else ngram")
    ap.add_argument("--prompt", default="Write a Python function that returns the n-th Fibonacci number "
                    "iteratively, with a docstring and type hints.")
    ap.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's own choice)")
    ap.add_argument("--max-overhead", type=float, default=5.0, help="percent; exit 1 above it (default 5)")
    ap.add_argument("--show", action="store_true", help="use the real display instead of offscreen")
    ap.add_argument("--json", type=Path, help="also write the results here")
    return ap.parse_args(argv)


def make_engine(args: argparse.Namespace):
    """(engine, controls class, description)."""
    if args.fake:
        from tests.app_fixtures import CODE_REPLY, FakeControls, FakeEngine

        return FakeEngine(CODE_REPLY * 4, work_ms=4.0), FakeControls, "scripted fake engine (4 ms numpy work/round)"
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from engine.engine import Controls, Engine

    if args.target or args.embedded:
        target, draft = args.target, args.draft
        if args.embedded:
            from engine.provision import default_pair

            target, draft = (str(p) for p in default_pair(lambda s, f: print(f"  {s} {f:.0%}", end="\r")))
        t = time.perf_counter()
        engine = Engine.load(target, draft, device=args.device)
        return engine, Controls, f"{engine.target_name} + {engine.draft_name} ({time.perf_counter() - t:.1f} s load)"
    from tests.tiny import tiny_engine

    engine = tiny_engine(max_seq_len=512)
    engine.eos_ids = set()  # a random model says EOS early; run to the length limit
    return engine, Controls, "tiny random Llama pair (tests/tiny.py)"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not args.show:
        os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    import app  # noqa: F401  (app.compat first)
    from PySide6.QtCore import QEventLoop, QSettings, QTimer
    from PySide6.QtWidgets import QApplication

    from app.window import MainWindow
    from app.worker import EngineHost
    from engine.config import SamplingParams, SpecParams

    qapp = QApplication.instance() or QApplication([])
    qapp.setStyle("Fusion")
    engine, controls, what = make_engine(args)
    drafter = args.drafter or ("model" if getattr(engine, "draft_name", None) else "ngram")
    sampling = SamplingParams(temperature=0.0, max_new_tokens=args.max_new_tokens, seed=0)
    spec = SpecParams(k=args.k, drafter=drafter)
    messages = [{"role": "user", "content": args.prompt}]

    host = EngineHost(engine, controls_factory=controls, lister=lambda: [])
    settings = QSettings(str(Path(os.environ.get("TMPDIR", "/tmp")) / "speclens-bench.ini"), QSettings.Format.IniFormat)
    window = MainWindow(host, settings)
    window.resize(1480, 900)
    window.controls.k_slider.setValue(args.k)
    window.controls.temp_slider.setValue(0)
    window.controls.max_tokens_spin.setValue(args.max_new_tokens)
    window.controls.seed_spin.setValue(0)
    window.controls.drafter_combo.setCurrentIndex(window.controls.drafter_combo.findData(drafter))
    window.show()

    summaries: dict[int, object] = {}
    host.worker.summaryReady.connect(lambda rid, s: summaries.__setitem__(rid, s))

    def wait_idle() -> None:
        while host.busy:
            loop = QEventLoop()
            QTimer.singleShot(5, loop.quit)
            loop.exec()

    def headless() -> object:
        host.reset()
        req = host.generate(messages, sampling, spec)
        wait_idle()
        return summaries[req.id]

    def gui() -> object:
        window.new_chat()
        window.input.setPlainText(args.prompt)
        window.send()
        wait_idle()
        window.repaint_frame()
        return window.record.summary

    results: dict[str, list[float]] = {"headless": [], "gui": []}
    tokens: dict[str, set] = {"headless": set(), "gui": set()}
    print(f"engine: {what}; drafter {drafter}, K {args.k}, greedy, {args.max_new_tokens} new tokens")
    variants = (("headless", headless), ("gui", gui))
    for i in range(args.runs + 1):  # run 0 warms up both; the order alternates
        for name, run in variants if i % 2 == 0 else variants[::-1]:
            s = run()
            tokens[name].add(s.new_tokens)
            if i:
                results[name].append(s.tokens_per_s)
            print(f"  run {i}{' (warm-up)' if not i else ''} {name:8s} {s.tokens_per_s:8.2f} tok/s "
                  f"({s.new_tokens} tokens, {s.rounds} rounds, acceptance {s.acceptance_rate:.0%})")
    if len(tokens["headless"] | tokens["gui"]) > 1:
        print(f"warning: runs produced different lengths {sorted(tokens['headless'] | tokens['gui'])}; "
              "tokens/s may not compare like with like")
    h, g = statistics.median(results["headless"]), statistics.median(results["gui"])
    overhead = 100.0 * (1.0 - g / h) if h > 0 else 0.0
    import torch  # noqa: PLC0415 - only for the report

    info = {
        "engine": what, "device": str(getattr(engine, "device", "cpu")), "platform": platform.platform(),
        "cpus": os.cpu_count(), "torch_threads": torch.get_num_threads() if "torch" in sys.modules else None,
        "qt_platform": qapp.platformName(), "runs": args.runs, "max_new_tokens": args.max_new_tokens,
        "headless_tok_s": results["headless"], "gui_tok_s": results["gui"],
        "headless_median": h, "gui_median": g, "overhead_percent": overhead,
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    print(f"median decode rate: headless {h:.2f} tok/s, with GUI {g:.2f} tok/s -> overhead {overhead:+.1f}% "
          f"(limit {args.max_overhead}%)  [{info['platform']}, {info['cpus']} CPUs, Qt {info['qt_platform']}]")
    if args.json:
        args.json.write_text(json.dumps(info, indent=2))
    host.shutdown()
    return 0 if overhead <= args.max_overhead else 1


if __name__ == "__main__":
    sys.exit(main())
