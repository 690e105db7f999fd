"""Two builds of the C++ kernels in one process, on the embedded pair, taking turns pass by pass: an A/B of a kernel
change (a rewrite, a compiler flag) that the host's drift cannot fake.

On the 2-vCPU development hosts the read bandwidth moves between ~36 and ~62 GB/s from one minute (sometimes one
second) to the next, and a one-token step with it by a third; two builds timed in alternating processes then differ
by whatever minutes each drew. Here both builds are loaded at once: "base" is the kernels of a git revision (default
HEAD), built under another module name with the working tree's build flags plus --base-flags; "new" is the working
tree's build, the one the engine loads. Both run the same packed weights, so a change must keep the packed layout.
Each round times every case once on each build, the builds' order alternating, and reads the bandwidth once; rounds
are split into the host's moods where their bandwidths part by a gap, and each mood reports the median of the
rounds' own new/base ratios with their quartiles.

    python -m scripts.profile.ab_builds [--base HEAD] [--base-flags=-fira-region=one] [--rounds 40] [--cases t1,t5,d1]
    python -m scripts.profile.ab_builds --base-prefetch 1   # a run-time choice of tune.py, the builds otherwise the same

Cases: tN a target pass over N tokens after the prompt, dN the draft's.
"""
from __future__ import annotations

import argparse
import io
import statistics
import subprocess
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

from engine.cpu import build, ext
from engine.cpu.stack import QuantStack
from engine.tools import results
from engine.tools.bench import load
from scripts.bench.kernels import ReadBandwidth, cpu_line
from scripts.bench.pair_passes import PairPasses

ROOT = Path(__file__).resolve().parents[2]
PROMPT = [{"role": "user", "content": "Write a Python function that returns the n-th Fibonacci number iteratively, "
                                      "with a docstring and type hints."}]
KINDS = {"t": "target", "d": "draft"}  # the cases' letters
MOOD_GAP = 0.25  # bandwidths of two moods: sorted, they part by a step of at least this fraction of the median
MOOD_SHARE = 0.1  # ... and each side holds at least this share of the rounds (a lone slow read is no mood)


def build_base(rev: str, flags: list[str], folder: Path):
    """The kernels' sources at `rev`, compiled under the name speclens_quant_ab with the build's flags + `flags`."""
    from torch.utils import cpp_extension

    # the CPU backend was engine/quant/ before it was engine/cpu/: older revisions keep it there
    for package in ("cpu", "quant"):
        tar = subprocess.run(["git", "-C", str(ROOT), "archive", rev, f"engine/{package}/csrc"], capture_output=True)
        if tar.returncode == 0:
            break
    else:
        raise SystemExit(f"{rev} has neither engine/cpu/csrc nor engine/quant/csrc")
    tarfile.open(fileobj=io.BytesIO(tar.stdout)).extractall(folder / "src", filter="data")
    csrc = folder / "src" / "engine" / package / "csrc"
    return cpp_extension.load(name="speclens_quant_ab", sources=[str(csrc / s) for s in build.SOURCES],
                              extra_cflags=[*build.CFLAGS, *flags], extra_ldflags=list(build.LDFLAGS),
                              build_directory=str(folder), verbose=False)


def switcher(model: torch.nn.Module, base, new) -> Callable[[str], None]:
    """use("base" | "new"): the model's kernel calls (its C++ stack and every module holding the extension) go to
    that build."""
    holders = [m for m in model.modules() if getattr(m, "_mod", None) is not None]
    stacks = {"base": QuantStack(model, base), "new": model.stack}  # the engine's own stack runs on `new`

    def use(which: str) -> None:
        mod = base if which == "base" else new
        model.stack = stacks[which]
        for h in holders:
            h._mod = mod

    return use


def moods(bws: list[float]) -> list[str]:
    """'fast' / 'slow' per round where the sorted bandwidths part by a gap, else 'all'."""
    ranked = sorted(bws)
    least = max(3, round(MOOD_SHARE * len(ranked)))
    gaps = [(ranked[i] - ranked[i - 1], ranked[i - 1]) for i in range(least, len(ranked) - least + 1)]
    if not gaps or max(gaps)[0] < MOOD_GAP * statistics.median(ranked):
        return ["all"] * len(bws)
    cut = max(gaps)[1]
    return ["slow" if b <= cut else "fast" for b in bws]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base", default="HEAD", help="the git revision whose kernels are the base")
    ap.add_argument("--base-flags", default="", help="compiler flags added to the base build's")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--cases", default="t1,t2,t3,t5,t9,d1,d3")
    ap.add_argument("--base-prefetch", type=int, choices=(0, 1), default=None,
                    help="the base build's weights asked ahead over 1-6 rows (default: as the engine's, tune.py)")
    ap.add_argument("--base-pair-from", type=int, default=None,
                    help="the base build's rows from which groups run in pairs (default: as the engine's)")
    results.add_arguments(ap)
    a = ap.parse_args()
    cases = [(c[0], int(c[1:])) for c in a.cases.split(",")]

    engine = load(None, None, None)
    new = ext.load()
    with tempfile.TemporaryDirectory() as tmp:
        base = build_base(a.base, a.base_flags.split(), Path(tmp))
    # this machine's tile choices, as the engine's build has them, unless the A/B is of those choices
    base.set_pair_from(new.pair_from() if a.base_pair_from is None else a.base_pair_from)
    base.set_stream_prefetch(new.stream_prefetch() if a.base_prefetch is None else a.base_prefetch)
    print(cpu_line())
    print(f"base: {a.base} {a.base_flags} (pair from {base.pair_from()}, prefetch {int(base.stream_prefetch())}); "
          f"new: the working tree (pair from {new.pair_from()}, prefetch {int(new.stream_prefetch())}); "
          f"kernels {new.isa()}")

    passes = PairPasses(engine, engine.encode_chat(PROMPT))
    use = {k: switcher(passes.models[name][0], base, new) for k, name in KINDS.items()}

    reader = ReadBandwidth()
    ms: dict[tuple[str, int, str], list[float]] = {}
    bws = []
    for r in range(a.rounds):
        for kind, width in cases:
            for which in (("base", "new") if r % 2 == 0 else ("new", "base")):
                use[kind](which)
                ms.setdefault((kind, width, which), []).append(passes.once(KINDS[kind], width))
        bws.append(reader.once())
    for kind in KINDS:
        use[kind]("new")

    split = moods(bws)
    figures: dict = {"base": a.base, "base_flags": a.base_flags, "kernels": new.isa(), "moods": {}}
    for mood in dict.fromkeys(split):
        rounds = [i for i, m in enumerate(split) if m == mood]
        span = [bws[i] for i in rounds]
        print(f"{mood}: {len(rounds)} rounds, read bandwidth {min(span):.0f}-{max(span):.0f} GB/s")
        at = figures["moods"][mood] = {"rounds": len(rounds), "read_gbs": [min(span), max(span)], "passes": {}}
        for kind, width in cases:
            b = [ms[(kind, width, "base")][i] for i in rounds]
            n = [ms[(kind, width, "new")][i] for i in rounds]
            ratios = sorted(y / x for x, y in zip(b, n))
            q = len(ratios) // 4
            name = "target" if kind == "t" else "draft"
            print(f"  {name} pass of {width:2d}: base {statistics.median(b):7.2f} ms  "
                  f"new {statistics.median(n):7.2f} ms  new/base {statistics.median(ratios):.3f} "
                  f"(quartiles {ratios[q]:.3f}-{ratios[-q - 1]:.3f})")
            at["passes"][f"{name} pass of {width}"] = {
                "base_ms": statistics.median(b), "new_ms": statistics.median(n),
                "new_over_base": statistics.median(ratios), "quartiles": [ratios[q], ratios[-q - 1]]}
    results.record(a, "scripts.profile.ab_builds", figures)


if __name__ == "__main__":
    main()
