"""engine/quant/tune.py: the per-machine tile choice, its rule, its cache and its overrides (a stand-in module:
the timing itself runs on the real kernels in tests/test_quant_kernels.py's bit check and at every load)."""
from __future__ import annotations

import json

import pytest

from engine.quant import tune


class Module:
    """What apply() uses of the kernels' module."""

    def __init__(self, isa: str = "avx512vnni") -> None:
        self._isa, self.setting, self.timed = isa, 0, 0

    def isa(self) -> str:
        return self._isa

    def set_pair_from(self, rows: int) -> None:
        self.setting = rows

    def pair_from(self) -> int:
        return self.setting


@pytest.mark.parametrize("times, choice", [
    ({3: (1.00, 0.80), 5: (1.00, 0.90)}, tune.NEVER),  # Zen 4: one group per register faster at both
    ({3: (1.00, 0.80), 5: (1.00, 1.01)}, tune.NEVER),  # faster over both
    ({3: (1.00, 0.99), 5: (1.00, 0.99)}, 0),  # not by the margin
    ({3: (0.70, 1.00), 5: (0.75, 1.00)}, 0),  # Zen 5: pairs faster
    ({}, 0),
])
def test_rule(times, choice):
    assert tune.choose_pair_from(times) == choice


def test_decided_once_per_build_and_cpu_then_read(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECLENS_PAIR_FROM", raising=False)
    cache = tmp_path / "ext" / "tuning.json"
    mod = Module()

    def timed(m, rows=tune.ROWS):
        m.timed += 1
        return {3: (1.0, 0.8), 5: (1.0, 0.85)}

    monkeypatch.setattr(tune, "time_pairs", timed)
    assert tune.apply(mod, "key1", cache) == tune.NEVER and mod.setting == tune.NEVER and mod.timed == 1
    assert json.loads(cache.read_text()) == {f"key1 {tune.cpu_id()}": tune.NEVER}
    again = Module()
    assert tune.apply(again, "key1", cache) == tune.NEVER and again.timed == 0  # read, not timed
    other = Module()
    tune.apply(other, "key2", cache)  # another build: timed again, both kept
    assert other.timed == 1 and len(json.loads(cache.read_text())) == 2


def test_the_cache_keeps_the_latest_choices(tmp_path, monkeypatch):
    """Every build decides once; the cache holds the latest KEEP of them, the newest last, not one per build ever."""
    monkeypatch.delenv("SPECLENS_PAIR_FROM", raising=False)
    cache = tmp_path / "tuning.json"
    monkeypatch.setattr(tune, "time_pairs", lambda m, rows=tune.ROWS: {3: (1.0, 0.8)})
    for i in range(tune.KEEP + 3):
        tune.apply(Module(), f"key{i}", cache)
    kept = list(json.loads(cache.read_text()))
    assert kept == [f"key{i} {tune.cpu_id()}" for i in range(3, tune.KEEP + 3)]


def test_a_damaged_cache_is_timed_over(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECLENS_PAIR_FROM", raising=False)
    cache = tmp_path / "tuning.json"
    cache.write_text("{not json")
    monkeypatch.setattr(tune, "time_pairs", lambda m, rows=tune.ROWS: {3: (1.0, 1.0)})
    assert tune.apply(Module(), "k", cache) == 0
    assert json.loads(cache.read_text()) == {f"k {tune.cpu_id()}": 0}


def test_other_instruction_sets_and_the_override(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECLENS_PAIR_FROM", raising=False)
    monkeypatch.setattr(tune, "time_pairs", lambda m, rows=tune.ROWS: pytest.fail("timed"))
    assert tune.apply(Module("avx2"), "k", tmp_path / "t.json") == 0 and not (tmp_path / "t.json").exists()
    monkeypatch.setenv("SPECLENS_PAIR_FROM", "5")
    mod = Module()
    assert tune.apply(mod, "k", tmp_path / "t.json") == 5 and mod.setting == 5


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


def test_the_cpu_is_read_from_its_first_processor_entry():
    from engine.quant.cpu import parse_cpuinfo

    entry = ("processor\t: {n}\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
             "model name\t: AMD EPYC 9R14 96-Core Processor\nflags\t\t: fpu sse4_2 avx2 fma f16c avx512f avx512_vnni\n")
    cpu = parse_cpuinfo(entry.format(n=0) + "\n" + entry.format(n=1), logical=2)
    assert (cpu.name, cpu.family, cpu.model) == ("AMD EPYC 9R14 96-Core Processor", "25", "17")
    assert cpu.simd == ["sse4_2", "avx2", "fma", "f16c", "avx512f", "avx512_vnni"]
    assert cpu.line() == ("AMD EPYC 9R14 96-Core Processor (family 25, model 17), 2 logical CPUs, "
                          "flags: sse4_2 avx2 fma f16c avx512f avx512_vnni")
    bare = parse_cpuinfo("processor\t: 0\n", logical=1)  # a kernel that names nothing
    assert bare.line() == "? (family ?, model ?), 1 logical CPUs, flags: unknown"
