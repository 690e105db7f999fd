"""A Transformer that runs a GGUF file's quantized weights as they are.

Every matrix, the embedding and the LM head included, keeps the file's blocks (Q4_K, Q6_K, ...) and is
multiplied by the quantized kernels of engine.cpu; norms and biases are the file's F32 vectors. q/k/v and
gate/up run as one matrix when their block types agree (Q4_K_M files store some v as Q6_K: those run apart).
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from engine.cpu import QuantEmbedding, QuantLinear, ext, formats
from engine.cpu.linear import Act, FileEmbedding, packed_slices
from engine.cpu.stack import QuantStack
from engine.io.gguf_file import GGUFFile
from engine.model.head_part import HeadPart
from engine.model.pages import Arena
from engine.model.transformer import Transformer


class Concat(nn.Module):
    """Matrices of different block types applied to one input, outputs side by side (q/k/v where v is Q6_K)."""

    def __init__(self, parts: list[nn.Module]) -> None:
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p(x) for p in self.parts], dim=-1)  # (T, sum N)


def fused(parts: list[QuantLinear]) -> nn.Module:
    """One kernel call for same-typed parts (fewer, larger matmuls run faster at decode time)."""
    try:
        return QuantLinear.concat(parts)
    except ValueError:
        return Concat(parts)


# Block types with more bits per weight than Q4_0 (4.5), which a re-quantized model runs as Q4_0. Q4_K stays: as
# many bits, finer scales.
HEAVIER_THAN_Q4_0 = {formats.T.Q5_0, formats.T.Q5_K, formats.T.Q6_K, formats.T.Q8_0, formats.T.F16, formats.T.BF16,
                     formats.T.F32}


def run_type(qtype: int, requant: int | None) -> int:
    """The block type a matrix stored as `qtype` runs as."""
    return requant if requant is not None and qtype in HEAVIER_THAN_Q4_0 else qtype


def _arena(gf: GGUFFile, requant: int | None) -> Arena | None:
    """Room for every matrix of the file, packed (engine.model.pages: what stays unused, like an untied embedding's
    share, is never touched, so costs nothing); None without the compiled kernels."""
    if ext.load() is None:
        return None
    total = sum(formats.packed_bytes(run_type(t.qtype, requant), *t.shape) + Arena.ALIGN
                for t in gf.tensors.values() if len(t.shape) == 2 and t.qtype in formats.FORMATS)
    return Arena(total) if total else None


def build_model(gf: GGUFFile, max_len: int, act: Act = "int8", head_rows: np.ndarray | None = None,
                requant: int | None = None) -> Transformer:
    """head_rows: the vocabulary ids the LM head scores (a trimmed draft head, engine.spec.draft_vocab); default all.
    requant: Q4_0 to run every matrix with more bits per weight as Q4_0 (a cheaper draft model); needs the kernels."""
    cfg = gf.config()
    model = Transformer(cfg, max_len)
    requant = requant if ext.load() is not None else None
    arena = _arena(gf, requant)
    take = arena.take if arena is not None else None

    def vector(name: str) -> nn.Parameter:
        return nn.Parameter(torch.from_numpy(gf.read_raw(name)), requires_grad=False)  # (N,) F32

    def matrix(name: str, bias: str | None = None, out: torch.Tensor | None = None,
               rows: np.ndarray | None = None) -> QuantLinear:
        t = gf.tensors[name]
        kind = run_type(t.qtype, requant)
        b = torch.from_numpy(gf.read_raw(bias)) if bias and bias in gf.tensors else None
        if out is None and take is not None:
            n = len(rows) if rows is not None else t.shape[0]
            out = packed_slices([(kind, n, t.shape[1])], take)[0]
        gf.prefault(name)
        if kind != t.qtype:  # packed as stored into a temporary buffer, then re-quantized into its place
            lin = QuantLinear(gf.blocks(name), t.qtype, t.shape[1], bias=b, act=act, rows=rows).requantized(kind, out)
        else:
            lin = QuantLinear(gf.blocks(name), t.qtype, t.shape[1], bias=b, act=act, out=out, rows=rows)
        if lin.packed is not None:  # repacked: the file's copy is no longer needed in memory
            gf.release(name)
        return lin

    def matrices(names: list[str], biases: list[str | None]) -> nn.Module:
        """Parts that run as one matrix: repacked straight into one buffer when their types agree."""
        specs = [(run_type(gf.tensors[n].qtype, requant), *gf.tensors[n].shape) for n in names]  # (qtype, N, K)
        outs = packed_slices(specs, take) if len({q for q, *_ in specs}) == 1 else None
        return fused([matrix(n, b, outs[i] if outs else None) for i, (n, b) in enumerate(zip(names, biases))])

    for i, block in enumerate(model.layers):
        p = f"blk.{i}."
        block.attn_norm.weight = vector(p + "attn_norm.weight")
        block.mlp_norm.weight = vector(p + "ffn_norm.weight")  # Gemma 3's pre-MLP norm is ffn_norm too
        if p + "attn_qkv.weight" in gf.tensors:  # Phi-3 stores q | k | v as one matrix
            block.attn.qkv = matrix(p + "attn_qkv.weight", p + "attn_qkv.bias")
        else:
            block.attn.qkv = matrices([p + f"attn_{n}.weight" for n in "qkv"], [p + f"attn_{n}.bias" for n in "qkv"])
        block.attn.o = matrix(p + "attn_output.weight")
        if cfg.qk_norm:  # per head, (D,) each
            block.attn.q_norm.weight = vector(p + "attn_q_norm.weight")
            block.attn.k_norm.weight = vector(p + "attn_k_norm.weight")
        if cfg.sandwich_norm:  # the norms on attention's and the MLP's outputs (Gemma 3)
            block.attn_post_norm.weight = vector(p + "post_attention_norm.weight")
            block.mlp_post_norm.weight = vector(p + "post_ffw_norm.weight")
        if p + "ffn_gate.weight" in gf.tensors:
            block.mlp.gate_up = matrices([p + "ffn_gate.weight", p + "ffn_up.weight"], [None, None])
        else:  # Phi-3's ffn_up holds gate rows | up rows already (GGUFFile._check_shapes checked its height)
            block.mlp.gate_up = matrix(p + "ffn_up.weight")
        block.mlp.down = matrix(p + "ffn_down.weight")
    model.norm.weight = vector("output_norm.weight")
    head = "output.weight" if "output.weight" in gf.tensors else "token_embd.weight"
    model.lm_head = matrix(head, rows=head_rows)
    if head == "output.weight" or head_rows is not None:
        embd = gf.tensors["token_embd.weight"]
        model.embed = FileEmbedding(gf.blocks(embd.name), embd.qtype, cfg.hidden_size)
    else:  # tied: the embedding looks its rows up in the LM head's blocks
        model.embed = QuantEmbedding.tied(model.lm_head)
    if head_rows is not None:
        model.head = HeadPart(torch.from_numpy(np.asarray(head_rows, dtype=np.int64)), cfg.vocab_size)
    model.stack = QuantStack.of(model)  # None where the stack cannot compute the layers: they run in torch
    # As llama.cpp's default cache: half the memory a long chat holds and half the bytes the stack's attention reads
    model.kv_dtype = torch.float16  # GGUF_KV_BYTES (engine.api.config): what the app counts a context at
    model.weights = arena.taken() if arena is not None else None
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t is not None and t.is_meta]
    if left:
        raise ValueError(f"{gf.path}: no weights for {', '.join(left[:5])}")
    return model.eval()
