"""The CPU the kernels run on, as the OS describes it: model name, family, model number and the SIMD flags that
matter here (Linux's /proc/cpuinfo; elsewhere what the platform module knows). One reader for the key of the
machine's tile choice (engine/cpu/tune.py) and for every benchmark's machine line."""
from __future__ import annotations

import functools
import os
import platform
from dataclasses import dataclass
from pathlib import Path

SIMD_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16",
              "avx_vnni", "amx_tile", "amx_int8")


@dataclass(frozen=True)
class Cpu:
    name: str  # "AMD EPYC 9R14", or "?" where the OS does not say
    family: str  # "25" ("?" off Linux)
    model: str  # "17"
    flags: frozenset[str]
    logical: int  # logical CPUs

    @property
    def simd(self) -> list[str]:
        """The SIMD flags of SIMD_FLAGS this CPU has, in that order."""
        return [f for f in SIMD_FLAGS if f in self.flags]

    def line(self) -> str:
        """What a benchmark prints and the README records: model, family, flags."""
        return (f"{self.name} (family {self.family}, model {self.model}), {self.logical} logical CPUs, "
                f"flags: {' '.join(self.simd) or 'unknown'}")


def parse_cpuinfo(text: str, logical: int) -> Cpu:
    """The first processor's entry of a /proc/cpuinfo text."""
    first = text.split("\n\n")[0]
    fields = {a.strip(): b.strip() for a, b in (ln.split(":", 1) for ln in first.splitlines() if ":" in ln)}
    return Cpu(fields.get("model name", "?"), fields.get("cpu family", "?"), fields.get("model", "?"),
               frozenset(fields.get("flags", "").split()), logical)


@functools.cache
def this_cpu() -> Cpu:
    logical = os.cpu_count() or 1
    try:
        return parse_cpuinfo(Path("/proc/cpuinfo").read_text(), logical)
    except OSError:
        return Cpu(platform.processor() or platform.machine() or "?", "?", "?", frozenset(), logical)
