"""The CPU backend: GGUF's quantized blocks (Q4_K, Q5_K, Q6_K, Q8_0, Q5_0, Q4_0, F16, BF16, F32) run as they are.

formats: block types and layouts; linear: QuantLinear and QuantEmbedding; stack: the whole decoder stack in C++
(csrc/decoder.cpp), attention included; dense: the same stack over dense weights; tune: the tile choice per machine;
machine: the CPU as the OS describes it. The kernels' build: ext loads them (prebuilt, cached, or compiled on first
use, with a pure-torch fallback), build compiles them, buildlock keeps two processes from compiling at once. No Qt;
of the engine it imports only the cache location (engine.paths).
"""
from engine.cpu.formats import FORMATS, UnsupportedType, fmt
from engine.cpu.linear import QuantEmbedding, QuantLinear


def kernels_available() -> bool:
    """True when the compiled kernels load (else the modules run the slow pure-torch fallback)."""
    from engine.cpu import ext

    return ext.load() is not None


def kernels_name() -> str:
    """What runs the quantized matrices, for the user: "AVX-512 VNNI kernels", ... or the fallback."""
    from engine.cpu import ext

    mod = ext.load()
    return f"{dict(mod.isa_table())[mod.isa()]} kernels" if mod is not None else "pure-torch fallback"


__all__ = ["FORMATS", "QuantEmbedding", "QuantLinear", "UnsupportedType", "fmt", "kernels_available", "kernels_name"]
