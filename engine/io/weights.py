"""Load a checkpoint (HF safetensors folder, .gguf file, or repo id in the local HF cache) into
(ModelConfig, state dict in Hugging Face tensor names, tokenizer)."""
from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from engine.api.config import ModelConfig
from engine.api.errors import ModelLoadError
from engine.io.hub import is_gguf, label, resolve
from engine.io.safetensors_file import read_safetensors, safetensors_files

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from engine.io.gguf_file import GGUFFile

Progress = Callable[[str, float], None]
log = logging.getLogger(__name__)

# The weight types the engine computes from (it casts them to its own dtype). safetensors also holds integer
# and fp8 tensors; those belong to quantized exports that need scales this loader does not apply.
_FLOATS = (torch.float32, torch.float16, torch.bfloat16, torch.float64)


@dataclass
class Checkpoint:
    name: str  # human label: folder name, file stem or repo id
    path: Path
    config: ModelConfig
    tensors: dict[str, torch.Tensor] | None  # HF names, on CPU; None: a GGUF to run quantized (see `gguf`)
    make_tokenizer: Callable[[], PreTrainedTokenizerBase]
    gguf: GGUFFile | None = None

    @cached_property
    def tokenizer(self) -> PreTrainedTokenizerBase:
        """Built on first use: a draft GGUF's pair check reads its vocabulary from the metadata instead."""
        return self.make_tokenizer()


def load_checkpoint(spec: str | Path, progress: Progress | None = None, *, dequantize: bool = True) -> Checkpoint:
    """Load a model. Safetensors are memory-mapped (no copy). A GGUF is dequantized to float32 tensors, or with
    dequantize=False only opened (memory-mapped), for the quantized kernels to run as it is."""
    path = resolve(spec)
    name = label(spec, path)
    report = progress or (lambda stage, frac: None)
    if is_gguf(path):
        return _load_gguf(path, name, report, dequantize)
    config = _read_config(path)
    if config.context_note:  # a context shorter than the model's (LongRoPE's short factors): the user learns why
        log.info("%s: %s", name, config.context_note)
        report(f"{name}: {config.context_note}", 0.0)
    shards = safetensors_files(path)
    tensors: dict[str, torch.Tensor] = {}
    for i, shard in enumerate(shards):
        report(f"Loading {name}: {100 * i // len(shards)}%", i / len(shards))
        tensors.update(read_safetensors(shard))
    report(f"Loading {name}: 100%", 1.0)
    tensors = {k: v for k, v in tensors.items() if not k.endswith("rotary_emb.inv_freq")}  # old HF exports
    check_tensors(config, tensors, path)
    return Checkpoint(name, path, config, tensors, lambda: load_tokenizer(path))


def load_tokenizer(spec: str | Path) -> PreTrainedTokenizerBase:
    """Just the tokenizer (with its chat template when the checkpoint has one)."""
    from transformers import AutoTokenizer

    path = resolve(spec)
    try:
        if is_gguf(path):
            from engine.io.gguf_file import GGUFFile
            from engine.io.gguf_tokenizer import tokenizer_from_gguf

            return tokenizer_from_gguf(path, GGUFFile(path, check_data=False).metadata)
        if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
            raise ModelLoadError(f"{path}: no tokenizer files (tokenizer.json / tokenizer_config.json)")
        return AutoTokenizer.from_pretrained(str(path))
    except ModelLoadError:
        raise
    except Exception as e:  # transformers raises many kinds (OSError, ValueError, KeyError, ...)
        raise ModelLoadError(f"{path}: cannot load tokenizer: {e}") from e


def _read_config(folder: Path) -> ModelConfig:
    cfg_path = folder / "config.json"
    if not cfg_path.is_file():
        raise ModelLoadError(f"{folder}: no config.json (expected a Hugging Face model folder with config.json "
                             "and *.safetensors, or a .gguf file)")
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{cfg_path}: unreadable config.json: {e}") from e
    try:
        config = ModelConfig.from_hf(cfg)
    except KeyError as e:
        raise ModelLoadError(f"{cfg_path}: config.json lacks {e}") from e
    except ValueError as e:
        raise ModelLoadError(f"{cfg_path}: {e}") from e
    gen = folder / "generation_config.json"  # chat models often list their end-of-turn ids only here
    if gen.is_file():
        try:
            eos = json.loads(gen.read_text()).get("eos_token_id")
        except (OSError, ValueError):
            eos = None
        extra = eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else []
        config = replace(config, eos_token_ids=tuple(dict.fromkeys([*config.eos_token_ids, *extra])))
    return config


def expected_shapes(c: ModelConfig, fused: bool = False) -> dict[str, tuple[int, ...]]:
    """HF tensor name -> shape for a config (lm_head only when untied); with fused, q/k/v and gate/up as Phi-3 stores
    them (qkv_proj, gate_up_proj)."""
    q, kv, C, inter = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim, c.hidden_size, c.intermediate_size
    out: dict[str, tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab_size, C), "model.norm.weight": (C,)}
    if not c.tie_word_embeddings:
        out["lm_head.weight"] = (c.vocab_size, C)
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        a, m = p + "self_attn.", p + "mlp."
        norms = ("input_layernorm", "post_attention_layernorm")
        if c.sandwich_norm:  # Gemma 3's four
            norms += ("pre_feedforward_layernorm", "post_feedforward_layernorm")
        out |= {p + n + ".weight": (C,) for n in norms}
        out |= {a + "o_proj.weight": (C, q), m + "down_proj.weight": (C, inter)}
        if fused:
            out |= {a + "qkv_proj.weight": (q + 2 * kv, C), m + "gate_up_proj.weight": (2 * inter, C)}
        else:
            out |= {a + "q_proj.weight": (q, C), a + "k_proj.weight": (kv, C), a + "v_proj.weight": (kv, C),
                    m + "gate_proj.weight": (inter, C), m + "up_proj.weight": (inter, C)}
        if c.attention_bias:
            out |= ({a + "qkv_proj.bias": (q + 2 * kv,)} if fused else
                    {a + "q_proj.bias": (q,), a + "k_proj.bias": (kv,), a + "v_proj.bias": (kv,)})
        if c.qk_norm:
            out |= {a + "q_norm.weight": (c.head_dim,), a + "k_norm.weight": (c.head_dim,)}
    return out


def check_tensors(config: ModelConfig, tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Every tensor the config needs is there, a float, with the right shape (catches config/weights mismatches
    early)."""
    problems = []
    fused = "model.layers.0.self_attn.qkv_proj.weight" in tensors  # Phi-3's layout
    expected = expected_shapes(config, fused)
    for name, shape in expected.items():
        t = tensors.get(name)
        if t is None:
            problems.append(f"missing {name}")
        elif t.dtype not in _FLOATS:
            raise ModelLoadError(f"{path}: {name} is stored as {str(t.dtype).removeprefix('torch.')}; SpecLens reads "
                                 "F32, F16, BF16 and F64 weights (quantized safetensors exports are not supported)")
        elif tuple(t.shape) != shape:
            problems.append(f"{name} has shape {tuple(t.shape)}, config implies {shape}")
    others = [n for n in tensors if n not in expected and n != "lm_head.weight"]
    if others:  # weights the engine has no place for are math it would leave out
        more = f" and {len(others) - 3} more" if len(others) > 3 else ""
        problems.append(f"unexpected {', '.join(others[:3])}{more} (SpecLens would run without them)")
    if problems:
        more = f" (and {len(problems) - 5} more)" if len(problems) > 5 else ""
        raise ModelLoadError(f"{path}: weights do not match config.json: {'; '.join(problems[:5])}{more}")
    head, embed = tensors.get("lm_head.weight"), tensors.get("model.embed_tokens.weight")
    if config.tie_word_embeddings and head is not None and not torch.equal(head, embed.to(head.dtype)):
        # A tied model scores with its embedding; a different stored head leaves which one it was trained with open
        raise ModelLoadError(f"{path}: config.json ties the LM head to the embedding (tie_word_embeddings), but the "
                             "weights hold a different lm_head.weight; SpecLens cannot tell which one is meant")


def _load_gguf(path: Path, name: str, report: Progress, dequantize: bool) -> Checkpoint:
    from engine.io.gguf_file import GGUFFile
    from engine.io.gguf_tokenizer import tokenizer_from_gguf

    gf = GGUFFile(path)
    config = gf.config()

    def tokenizer() -> PreTrainedTokenizerBase:
        return tokenizer_from_gguf(path, gf.metadata)
    if not dequantize:
        return Checkpoint(name, path, config, None, tokenizer, gf)
    names = [n for n in gf.tensors if gf.hf_name(n) is not None]
    tensors: dict[str, torch.Tensor] = {}
    for i, n in enumerate(names):
        if i % 16 == 0:
            report(f"Loading {name}: {100 * i // len(names)}%", i / len(names))
        tensors[gf.hf_name(n)] = torch.from_numpy(gf.read(n))
    report(f"Loading {name}: 100%", 1.0)
    check_tensors(config, tensors, path)
    return Checkpoint(name, path, config, tensors, tokenizer, gf)
