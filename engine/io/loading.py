"""Build an Engine from checkpoints: load, check the pair is compatible, place on the device."""
from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

from engine.api.config import DEFAULT_CONTEXT, CacheConfig
from engine.cpu import ext
from engine.cpu.dense import run_on_kernels
from engine.cpu.formats import T
from engine.io.weights import Checkpoint, ModelLoadError, load_checkpoint
from engine.model.cpu_linear import (
    Int8Linear,
    PackedLinear,
    int8_supported,
    packed_supported,
    swap_linears,
)
from engine.model.device import pick_device
from engine.model.pages import HugePages
from engine.model.transformer import Transformer
from engine.runtime.engine import Engine
from engine.spec.draft_vocab import DRAFT_VOCAB, head_rows

Progress = Callable[[str, float], None]

# A GGUF draft's Q5_0/Q8_0/Q6_K matrices run as Q4_0 on the CPU: the embedded 0.5B draft streams 235 MB a token
# instead of 310, and its greedy acceptance on the benchmark prompts did not drop (0.811 against 0.802 as stored).
# A dense draft's do too: at Llama-3.2-1B's shapes a step took 14 ms against 71 int8 weight-only through torch.
DRAFT_REQUANT: int | None = int(T.Q4_0)


def check_pair(target: Checkpoint, draft: Checkpoint) -> None:
    """Draft and target must speak the same tokens; the message names the first mismatch."""
    if target.config.vocab_size != draft.config.vocab_size:
        raise ModelLoadError(
            f"vocabulary mismatch: target {target.name} has {target.config.vocab_size} tokens, "
            f"draft {draft.name} has {draft.config.vocab_size}"
        )
    if target.gguf is not None and draft.gguf is not None:  # compare the files' vocabularies, build nothing
        _check_gguf_vocab(target, draft)
        return
    tt, dt = target.tokenizer, draft.tokenizer
    tv, dv = tt.get_vocab(), dt.get_vocab()
    if tv != dv:
        diff = next((t for t in tv if dv.get(t) != tv[t]), None) or next(t for t in dv if t not in tv)
        raise ModelLoadError(
            f"vocabulary mismatch between target {target.name} and draft {draft.name}: "
            f"token {diff!r} is {tv.get(diff)} in the target and {dv.get(diff)} in the draft"
        )
    for attr in ("bos_token_id", "eos_token_id", "pad_token_id"):
        a, b = getattr(tt, attr, None), getattr(dt, attr, None)
        if a is not None and b is not None and a != b:
            raise ModelLoadError(f"special-token mismatch: {attr} is {a} in the target and {b} in the draft")


def _check_gguf_vocab(target: Checkpoint, draft: Checkpoint) -> None:
    tm, dm = target.gguf.metadata, draft.gguf.metadata
    tv, dv = tm.get("tokenizer.ggml.tokens") or [], dm.get("tokenizer.ggml.tokens") or []
    if tv != dv:
        i = next((i for i, (a, b) in enumerate(zip(tv, dv)) if a != b), min(len(tv), len(dv)))
        a, b = (tv[i] if i < len(tv) else None), (dv[i] if i < len(dv) else None)
        raise ModelLoadError(f"vocabulary mismatch between target {target.name} and draft {draft.name}: "
                             f"token {i} is {a!r} in the target and {b!r} in the draft")
    for key in ("bos", "eos", "padding"):
        a, b = tm.get(f"tokenizer.ggml.{key}_token_id"), dm.get(f"tokenizer.ggml.{key}_token_id")
        if a is not None and b is not None and a != b:
            raise ModelLoadError(f"special-token mismatch: {key}_token_id is {a} in the target and {b} in the draft")


def eos_ids(ckpt: Checkpoint) -> set[int]:
    """EOS from the config and tokenizer, plus chat end-of-turn markers the template uses."""
    ids = set(ckpt.config.eos_token_ids)
    tok = ckpt.tokenizer
    if tok.eos_token_id is not None:
        ids.add(tok.eos_token_id)
    # token_to_id where the tokenizer has it: get_vocab() builds a 150k-entry dict (~0.2 s)
    lookup = getattr(tok, "token_to_id", None) or tok.get_vocab().get
    for marker in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>", "<|end_of_text|>"):
        if (i := lookup(marker)) is not None:
            ids.add(i)
    return ids


def check_paths(target: str, draft: str | None = None) -> None:
    """Each model path names a file or folder SpecLens can open: a typo is told at once, not after the kernels
    compile (a minute and more on a fresh machine)."""
    from engine.io.hub import resolve

    for spec in (target, draft):
        if spec is not None:
            resolve(spec)


def load_engine(
    target: str, draft: str | None = None, *, device: str | None = None, progress: Progress | None = None,
    cache: CacheConfig | None = None, draft_int8: bool | None = None, draft_vocab: int | None = DRAFT_VOCAB,
    context: int | None = None, draft_requant: int | None = DRAFT_REQUANT,
) -> Engine:
    """An Engine over the target (and draft) checkpoints: HF folders, .gguf files or cached repo ids.

    draft_vocab: how many of the most common token ids a GGUF draft's LM head scores (engine.spec.draft_vocab;
    None: all). draft_requant: the block type a draft's heavier matrices run as on the CPU (None: a GGUF's as stored,
    a dense draft int8 weight-only through torch).
    Both are lossless (the target decides every token) and make draft steps cheaper.
    context: the KV cache's length in tokens (the app's setting), at most the models' limit; None: the limit,
    at most DEFAULT_CONTEXT. `cache` overrides both."""
    report = progress or (lambda stage, frac: None)
    dev, dtype = pick_device(device)
    cpu = dev.type == "cpu"
    t0 = time.perf_counter()
    # On the CPU a GGUF runs as it is (quantized kernels); elsewhere it is dequantized at load.
    tgt = load_checkpoint(target, lambda s, f: report(f"target: {s}", 0.45 * f), dequantize=not cpu)
    dft = (load_checkpoint(draft, lambda s, f: report(f"draft: {s}", 0.45 + 0.25 * f), dequantize=not cpu)
           if draft else None)
    if dft is not None:
        check_pair(tgt, dft)
    contexts = [c.config.max_position_embeddings for c in (tgt, dft) if c is not None]
    max_len = (cache or CacheConfig(max_seq_len=min(*contexts, context or DEFAULT_CONTEXT))).max_seq_len
    if cpu and any(c is not None and c.tensors is None for c in (tgt, dft)):  # a GGUF runs on the kernels
        ext.load()  # decided first (and the kernel tiles timed, once per machine) while nothing else runs
    # The tokenizer (~0.6 s of mostly Python) is built while the weights are repacked (C++, GIL released)
    with ThreadPoolExecutor(1, thread_name_prefix="speclens-tokenizer") as pool:
        tokenizer = pool.submit(lambda: tgt.tokenizer)
        report("Placing target on " + dev.type, 0.75)
        target_model = place(tgt, dtype, dev, max_len, int8=False)
        draft_model = None
        if dft is not None:
            report("Placing draft on " + dev.type, 0.9)
            rows = head_rows(dft.gguf.metadata, dft.config.vocab_size, draft_vocab) if dft.tensors is None else None
            draft_model = place(dft, dtype, dev, max_len, int8=draft_int8 if draft_int8 is not None else cpu,
                                head_rows=rows, requant=draft_requant)
        engine = Engine(
            target_model, tokenizer.result(), draft_model, cache=cache or CacheConfig(max_seq_len=max_len),
            target_name=tgt.name, draft_name=dft.name if dft else None, eos_ids=eos_ids(tgt),
        )
    if tgt.tensors is None:  # the GGUF's own blocks
        engine.weights_format = tgt.gguf.file_type
    engine.huge_pages = HugePages([m.weights for m in (target_model, draft_model) if m is not None and m.weights is not None])
    engine.load_seconds = time.perf_counter() - t0
    report("Ready", 1.0)
    return engine


def place(ckpt: Checkpoint, dtype: torch.dtype, dev: torch.device, max_len: int, int8: bool,
          act: str = "int8", head_rows: np.ndarray | None = None, requant: int | None = None) -> Transformer:
    """The model on its device: a GGUF's own blocks through the quantized kernels, or dense tensors.

    Dense on the CPU: the target on the kernels' F32 units and the C++ stack, batch-invariant (engine.cpu.dense),
    or without them fp32 prepacked for oneDNN; a draft re-quantized to `requant` on the kernels, else int8
    weight-only through torch (cheaper steps; speculative output is unchanged, only the target decides)."""
    if ckpt.tensors is None:
        from engine.io.gguf_model import build_model

        return build_model(ckpt.gguf, max_len, act, head_rows, requant)
    model = Transformer.from_state_dict(ckpt.config, ckpt.tensors, dtype, dev, max_len)
    if dev.type != "cpu":
        return model
    if requant is not None and run_on_kernels(model, requant):  # a draft re-quantized (Q4_0) on the kernels
        return model
    if int8 and int8_supported():
        return swap_linears(model, Int8Linear)
    if run_on_kernels(model):  # batch-invariant, so greedy speculation stays exact (engine.cpu.dense)
        return model
    return swap_linears(model, PackedLinear) if packed_supported() else model


