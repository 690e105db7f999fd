"""engine/cpu/tune.py: the per-machine tile choice, its rule, its cache and its overrides (a stand-in module:
the timing itself runs on the real kernels in tests/kernels/test_kernels.py's bit check and at every load)."""
from __future__ import annotations

import json

import pytest

from engine.cpu import tune


class Module:
    """What apply() uses of the kernels' module."""

    def __init__(self, isa: str = "avx512vnni") -> None:
        self._isa, self.setting, self.prefetch = isa, 0, 0

    def isa(self) -> str:
        return self._isa

    def set_pair_from(self, rows: int) -> None:
        self.setting = rows

    def pair_from(self) -> int:
        return self.setting

    def set_stream_prefetch(self, on: int) -> None:
        self.prefetch = on

    def stream_prefetch(self) -> int:
        return self.prefetch


class Timings:
    """Stand-ins for the two timings: what they report, and how often each ran."""

    def __init__(self, monkeypatch, pairs=None, stream=None) -> None:
        self.calls = {"pairs": 0, "stream": 0}
        pairs = {3: (1.0, 0.8), 5: (1.0, 0.85)} if pairs is None else pairs  # Zen 4: one group per register
        stream = {"Q4_0": (1.0, 1.05)} if stream is None else stream  # Zen 4: left to the hardware

        def time_pairs(m, rows=tune.ROWS):
            self.calls["pairs"] += 1
            return pairs

        def time_stream_prefetch(m):
            self.calls["stream"] += 1
            return stream

        monkeypatch.setattr(tune, "time_pairs", time_pairs)
        monkeypatch.setattr(tune, "time_stream_prefetch", time_stream_prefetch)


@pytest.fixture
def no_overrides(monkeypatch):
    for name in tune.ENV.values():
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize("times, choice", [
    ({3: (1.00, 0.80), 5: (1.00, 0.90)}, tune.NEVER),  # Zen 4: one group per register faster at both
    ({3: (1.00, 0.80), 5: (1.00, 1.01)}, tune.NEVER),  # faster over both
    ({3: (1.00, 0.99), 5: (1.00, 0.99)}, 0),  # not by the margin
    ({3: (0.70, 1.00), 5: (0.75, 1.00)}, 0),  # Zen 5: pairs faster
    ({}, 0),
])
def test_pair_rule(times, choice):
    assert tune.choose_pair_from(times) == choice


@pytest.mark.parametrize("times, choice", [
    ({"Q4_0 1": (1.00, 1.05), "Q4_K 1": (1.00, 1.03), "Q4_K 5": (1.00, 1.00)}, 0),  # Zen 4: the hardware alone
    ({"Q4_0 1": (1.00, 0.85), "Q4_K 1": (1.00, 0.90)}, 1),  # asking ahead faster by the margin
    ({"Q4_0 1": (1.00, 0.99), "Q4_K 1": (1.00, 0.99)}, 0),  # not by the margin
    ({"Q4_0 1": (1.00, 0.80), "Q4_K 5": (1.00, 1.30)}, 0),  # faster on one case, slower over all
    ({}, 0),
])
def test_stream_prefetch_rule(times, choice):
    assert tune.choose_stream_prefetch(times) == choice


def test_decided_once_per_build_and_cpu_then_read(tmp_path, monkeypatch, no_overrides):
    cache = tmp_path / "ext" / "tuning.json"
    timings = Timings(monkeypatch, stream={"Q4_0 1": (1.0, 0.8)})
    mod = Module()
    assert tune.apply(mod, "key1", cache) == tune.Tiles(pair_from=tune.NEVER, stream_prefetch=1)
    assert (mod.setting, mod.prefetch) == (tune.NEVER, 1) and timings.calls == {"pairs": 1, "stream": 1}
    assert json.loads(cache.read_text()) == {f"key1 {tune.cpu_id()}": {"pair_from": tune.NEVER, "stream_prefetch": 1}}
    again = Module()
    assert tune.apply(again, "key1", cache) == tune.Tiles(tune.NEVER, 1) and (again.setting, again.prefetch) == (17, 1)
    assert timings.calls == {"pairs": 1, "stream": 1}  # read, not timed
    tune.apply(Module(), "key2", cache)  # another build: timed again, both kept
    assert timings.calls == {"pairs": 2, "stream": 2} and len(json.loads(cache.read_text())) == 2


def test_the_cache_keeps_the_latest_choices(tmp_path, monkeypatch, no_overrides):
    """Every build decides once; the cache holds the latest KEEP of them, the newest last, not one per build ever."""
    cache = tmp_path / "tuning.json"
    Timings(monkeypatch)
    for i in range(tune.KEEP + 3):
        tune.apply(Module(), f"key{i}", cache)
    kept = list(json.loads(cache.read_text()))
    assert kept == [f"key{i} {tune.cpu_id()}" for i in range(3, tune.KEEP + 3)]


@pytest.mark.parametrize("content", ["{not json", "[1, 2]", None])
def test_a_damaged_or_older_cache_is_timed_over(tmp_path, monkeypatch, no_overrides, content):
    """Unreadable, not a mapping, or an entry of the format before the stream prefetch (a bare pair choice)."""
    cache = tmp_path / "tuning.json"
    cache.write_text(content if content is not None else json.dumps({f"k {tune.cpu_id()}": tune.NEVER}))
    timings = Timings(monkeypatch, pairs={3: (1.0, 1.0)})
    assert tune.apply(Module(), "k", cache) == tune.Tiles(0, 0) and timings.calls == {"pairs": 1, "stream": 1}
    assert json.loads(cache.read_text())[f"k {tune.cpu_id()}"] == {"pair_from": 0, "stream_prefetch": 0}


def test_what_each_instruction_set_decides(tmp_path, monkeypatch, no_overrides):
    """Pairs are AVX-512's alone; the stream prefetch is every x86 build's; the scalar kernels decide nothing."""
    timings = Timings(monkeypatch, stream={"Q4_0 1": (1.0, 0.8)})
    mod = Module("avx2")
    assert tune.apply(mod, "k", tmp_path / "t.json") == tune.Tiles(0, 1) and mod.prefetch == 1
    assert timings.calls == {"pairs": 0, "stream": 1}
    assert json.loads((tmp_path / "t.json").read_text()) == {f"k {tune.cpu_id()}": {"stream_prefetch": 1}}
    assert tune.apply(Module("scalar"), "k", tmp_path / "s.json") == tune.Tiles(0, 0)
    assert timings.calls == {"pairs": 0, "stream": 1} and not (tmp_path / "s.json").exists()


def test_the_overrides_decide_and_nothing_is_saved(tmp_path, monkeypatch, no_overrides):
    timings = Timings(monkeypatch)
    monkeypatch.setenv("SPECLENS_PAIR_FROM", "5")
    mod = Module()
    assert tune.apply(mod, "k", tmp_path / "t.json") == tune.Tiles(5, 0) and mod.setting == 5
    assert timings.calls == {"pairs": 0, "stream": 1} and not (tmp_path / "t.json").exists()
    monkeypatch.setenv("SPECLENS_STREAM_PREFETCH", "1")
    assert tune.apply(mod, "k", tmp_path / "t.json") == tune.Tiles(5, 1) and mod.prefetch == 1
    assert timings.calls == {"pairs": 0, "stream": 1}


def test_timing_restores_the_setting_it_found(kernels):
    machine = kernels.pair_from()
    kernels.set_pair_from(7)
    try:
        times = tune.time_pairs(kernels, rows=(3,))
        assert kernels.pair_from() == 7
        (paired, never), = times.values()
        assert paired > 0 and never > 0
    finally:
        kernels.set_pair_from(machine)


def test_stream_prefetch_timing_restores_the_setting_it_found(kernels, monkeypatch):
    monkeypatch.setattr(tune, "COLD_BYTES", 16 << 20)  # the timing's shape, less of it
    monkeypatch.setattr(tune, "ROUNDS", 2)
    machine = kernels.stream_prefetch()
    kernels.set_stream_prefetch(1 - machine)
    try:
        times = tune.time_stream_prefetch(kernels)
        assert kernels.stream_prefetch() == 1 - machine
        assert len(times) == len(tune.STREAM_CASES) and all(a > 0 and b > 0 for a, b in times.values())
    finally:
        kernels.set_stream_prefetch(machine)


def test_the_cpu_is_read_from_its_first_processor_entry():
    from engine.cpu.machine import parse_cpuinfo

    entry = ("processor\t: {n}\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
             "model name\t: AMD EPYC 9R14 96-Core Processor\nflags\t\t: fpu sse4_2 avx2 fma f16c avx512f avx512_vnni\n")
    cpu = parse_cpuinfo(entry.format(n=0) + "\n" + entry.format(n=1), logical=2)
    assert (cpu.name, cpu.family, cpu.model) == ("AMD EPYC 9R14 96-Core Processor", "25", "17")
    assert cpu.simd == ["sse4_2", "avx2", "fma", "f16c", "avx512f", "avx512_vnni"]
    assert cpu.line() == ("AMD EPYC 9R14 96-Core Processor (family 25, model 17), 2 logical CPUs, "
                          "flags: sse4_2 avx2 fma f16c avx512f avx512_vnni")
    bare = parse_cpuinfo("processor\t: 0\n", logical=1)  # a kernel that names nothing
    assert bare.line() == "? (family ?, model ?), 1 logical CPUs, flags: unknown"
