"""Whether a GGUF can run, judged by the family table (engine.model.families) and what the file itself holds: its
family's row, the metadata keys that change the math, and every tensor, each of which must have a place in the
engine's decoder. A file that fails is refused with a sentence naming what it lacks; nothing of it is run.
"""
from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from engine.model.families import BY_GGUF_ARCH, FEATURES, phrases, runnable_names

# The tensors the engine computes with, as llama.cpp names them (per layer after "blk.N."). Any other tensor in a
# file is math SpecLens would leave out, so such a file is refused rather than run without it.
GGUF_TOP_TENSORS = {"token_embd.weight", "output_norm.weight", "output.weight", "rope_freqs.weight",
                    "rope_factors_short.weight", "rope_factors_long.weight"}  # llama3's / LongRoPE's factors
GGUF_LAYER_TENSORS = {"attn_norm.weight", "ffn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
                      "attn_q.bias", "attn_k.bias", "attn_v.bias", "attn_output.weight", "ffn_gate.weight",
                      "ffn_up.weight", "ffn_down.weight"}
# A per-layer tensor's name (its part before ".weight"/".bias") -> the feature it carries. A family whose row has
# the feature runs it (once implemented); in any other family's file it has no place, and the file is refused.
_GGUF_TENSOR_FEATURES = {"attn_q_norm": "qk_norm", "attn_k_norm": "qk_norm", "attn_qkv": "fused_qkv",
                         "ffn_gate_inp": "moe", "ffn_gate_exps": "moe", "ffn_up_exps": "moe", "ffn_down_exps": "moe",
                         "post_attention_norm": "sandwich_norm", "post_ffw_norm": "sandwich_norm"}
_GGUF_BIASES = {"attn_output": "o_bias", "ffn_gate": "mlp_bias", "ffn_up": "mlp_bias", "ffn_down": "mlp_bias"}
# metadata keys (after "<arch>.") that change the math when set and non-zero
_GGUF_KEYS = {"expert_count": "moe", "final_logit_softcapping": "logit_softcap",
              "attn_logit_softcapping": "logit_softcap", "embedding_scale": "multipliers",
              "residual_scale": "multipliers", "logit_scale": "multipliers", "attention.scale": "multipliers"}


def gguf_refusal(arch: str, metadata: Mapping[str, Any] | None = None, tensors: Iterable[str] = ()) -> str | None:
    """Why a GGUF of this general.architecture (with this metadata and these tensors) cannot run, in a sentence;
    None when it can."""
    fam = BY_GGUF_ARCH.get(arch)
    if fam is None:
        return f"unsupported architecture {arch!r} (SpecLens runs {', '.join(runnable_names(gguf=True))})"
    if (why := fam.refusal()) is not None:
        return why
    meta = metadata or {}
    head_dim = _gguf_head_dim(arch, meta)
    # a family whose row has the feature reads these keys (engine.io.gguf_config); in any other family's file they are
    # math its architecture leaves out
    needs = [f for key, f in _GGUF_KEYS.items() if not (FEATURES[f].implemented and f in fam.features)
             and _changes_math(key, meta.get(f"{arch}.{key}"), head_dim)]
    others = []
    for name in tensors:
        parts = name.split(".", 2)
        in_layer = len(parts) == 3 and parts[0] == "blk"
        own = parts[2] if in_layer else name
        if own in (GGUF_LAYER_TENSORS if in_layer else GGUF_TOP_TENSORS):
            continue
        stem = own.rsplit(".", 1)[0]
        kind = _GGUF_TENSOR_FEATURES.get(stem) or (_GGUF_BIASES.get(stem) if own.endswith(".bias") else None)
        if kind is not None and not FEATURES[kind].implemented:
            needs.append(kind)
        elif (kind is None or kind not in fam.features) and name not in others:
            others.append(name)
    rot = _count(meta.get(f"{arch}.rope.dimension_count"))
    if rot and head_dim and rot < head_dim and not FEATURES["partial_rotary"].implemented:
        needs.append("partial_rotary")
    lacking = [FEATURES[k].phrase for k in dict.fromkeys(needs) if not FEATURES[k].implemented]
    if lacking:
        return f"this {fam.title} GGUF needs {phrases(lacking)}, which SpecLens does not implement yet"
    foreign = [FEATURES[k].phrase for k in dict.fromkeys(needs)]
    if foreign:
        return (f"this {fam.title} GGUF sets {phrases(foreign)}, which the {fam.title} architecture does not have; "
                "SpecLens will not guess which model was meant")
    if others:
        more = f" and {len(others) - 3} more" if len(others) > 3 else ""
        return (f"this {fam.title} GGUF holds tensors SpecLens has no place for ({', '.join(others[:3])}{more}); "
                "running without them would be a different model")
    return None


def _changes_math(key: str, v: object, head_dim: int) -> bool:
    """Whether a metadata value departs from what the engine computes (absent, 0, a scale of 1, or attention scaled
    by 1/sqrt(head_dim) as always); a value of an unexpected type counts as a departure."""
    if v is None:
        return False
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return True
    if key == "attention.scale":
        return not (head_dim and math.isclose(v, head_dim ** -0.5, rel_tol=1e-6))
    return v != (1.0 if key.endswith("scale") else 0)


def _count(v: object) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) and v > 0 else 0


def _gguf_head_dim(arch: str, meta: Mapping[str, Any]) -> int:
    if d := _count(meta.get(f"{arch}.attention.key_length")):
        return d
    hidden, heads = _count(meta.get(f"{arch}.embedding_length")), _count(meta.get(f"{arch}.attention.head_count"))
    return hidden // heads if hidden and heads else 0
