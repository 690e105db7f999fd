"""Quantized linear layers over GGUF blocks (Q4_K, Q5_K, Q6_K, Q8_0, Q5_0, Q4_0, F16, BF16, F32) for the CPU.

formats: block types and layouts; ext: the C++/OpenMP kernels (built on first use, with a pure-torch
fallback); linear: QuantLinear and QuantEmbedding. No Qt; of the engine it imports only the cache location (engine.io.provision).
"""
from engine.quant.formats import FORMATS, UnsupportedType, fmt
from engine.quant.linear import QuantEmbedding, QuantLinear


def kernels_available() -> bool:
    """True when the compiled kernels load (else the modules run the slow pure-torch fallback)."""
    from engine.quant import ext

    return ext.load() is not None


def kernels_name() -> str:
    """What runs the quantized matrices, for the user: "AVX-512 VNNI kernels", ... or the fallback."""
    from engine.quant import ext

    mod = ext.load()
    return f"{dict(mod.isa_table())[mod.isa()]} kernels" if mod is not None else "pure-torch fallback"


__all__ = ["FORMATS", "QuantEmbedding", "QuantLinear", "UnsupportedType", "fmt", "kernels_available", "kernels_name"]
