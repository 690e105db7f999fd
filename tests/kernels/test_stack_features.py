"""The C++ decoder stack's optional layer features (Qwen3's and Gemma 3's q/k norms, Gemma's sandwich norms and
GELU, sliding windows with a local rotary table, Phi's partial rotary, a non-default attention scale): each against
a float64 reference written out here, and batch-invariant with windows crossing passes and key chunks."""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from engine.api.config import ModelConfig
from engine.cpu import ext, kernels_available
from engine.cpu.stack import QuantStack
from engine.io.gguf_file import GGUFFile
from engine.io.gguf_model import build_model
from engine.io.loading import place
from engine.io.weights import load_checkpoint
from engine.model.kv_cache import BlockManager, KVPool
from engine.model.transformer import RMSNorm, Transformer

try:
    from isa import outputs_per_isa_and_threads
    from test_gguf_families import IDS, converter, family
    from test_weights import make_hf_model, make_tokenizer, write_gguf
except ImportError:  # tests/ imported as a package
    from tests.engine.test_families_hf import ATOL as HF_ATOL
    from tests.engine.test_families_hf import FAMILIES as HF_FAMILIES
    from tests.engine.test_families_hf import hf_model, ours_by_passes
    from tests.engine.test_families_hf import ids as hf_ids
    from tests.engine.test_gguf_families import IDS, converter, family  # noqa: F401
    from tests.engine.test_weights import make_hf_model, make_tokenizer, write_gguf
    from tests.isa import outputs_per_isa_and_threads

pytestmark = pytest.mark.skipif(not kernels_available(), reason="the C++ kernels did not build here")
MAX_LEN = 400


@dataclass(frozen=True)
class Features:
    qk_norm: bool = False
    sandwich: bool = False
    activation: str = "silu"
    window: int = 0  # in the layers `windowed` marks
    windowed: tuple[bool, ...] = ()
    local_theta: float | None = None  # the windowed layers' rotary base (Gemma 3); None: the global table
    rotary_dim: int = 0  # 0: head_dim
    scale: float = 0.0  # 0: 1 / sqrt(head_dim)


class Table(nn.Module):
    """cos and sin (P, rotary_dim) as Rotary holds them: each frequency twice (rotate-half pairs j and j + R/2)."""

    def __init__(self, theta: float, rotary_dim: int, positions: int) -> None:
        super().__init__()
        inv = 1.0 / theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
        ang = torch.outer(torch.arange(positions, dtype=torch.float64), inv)
        ang = torch.cat([ang, ang], dim=-1)
        self.register_buffer("cos", ang.cos().float())
        self.register_buffer("sin", ang.sin().float())


def norm(n: int, eps: float, gen: torch.Generator) -> RMSNorm:
    m = RMSNorm(n, eps)
    m.weight = nn.Parameter(0.5 + torch.rand(n, generator=gen), requires_grad=False)
    return m


def give(model: Transformer, feat: Features) -> Transformer:
    """The model's modules with feat's parts, by the names engine.model.transformer gives them."""
    cfg = model.cfg
    gen = torch.Generator().manual_seed(7)
    R = feat.rotary_dim or cfg.head_dim
    model.rope = Table(cfg.rope_theta, R, MAX_LEN)
    model.rope_local = Table(feat.local_theta, R, MAX_LEN) if feat.local_theta else None
    for i, block in enumerate(model.layers):
        block.mlp.activation = feat.activation
        attn = block.attn
        attn.q_norm = norm(cfg.head_dim, cfg.rms_norm_eps, gen) if feat.qk_norm else None
        attn.k_norm = norm(cfg.head_dim, cfg.rms_norm_eps, gen) if feat.qk_norm else None
        block.attn_post_norm = norm(cfg.hidden_size, cfg.rms_norm_eps, gen) if feat.sandwich else None
        block.mlp_post_norm = norm(cfg.hidden_size, cfg.rms_norm_eps, gen) if feat.sandwich else None
        attn.window = feat.window if feat.window and (not feat.windowed or feat.windowed[i]) else None
        attn.rotary_dim = R
        attn.scale = feat.scale or cfg.head_dim ** -0.5
    return model


# ---- the reference: every position at once, float64 outside the (exact, fp32-activation) matmuls ----------------
def rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w.double() * (x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x (N, heads, D): rotate-half over the first R = cos.shape[-1] dims, the rest unchanged."""
    R = cos.shape[-1]
    r, rest = x[..., :R], x[..., R:]
    turned = torch.cat([-r[..., R // 2 :], r[..., : R // 2]], dim=-1)
    return torch.cat([r * cos[:, None].double() + turned * sin[:, None].double(), rest], dim=-1)


def linear(m: nn.Module, x: torch.Tensor) -> torch.Tensor:
    return m(x.float()).double()


def reference(model: Transformer, x: torch.Tensor) -> torch.Tensor:
    """x (N, C) embeddings of positions 0..N-1 -> (N, C) final-normed states, read from the modules `give` set."""
    cfg = model.cfg
    H, Hkv, D, eps = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.rms_norm_eps
    N, x = len(x), x.double()
    p = torch.arange(N)
    for block in model.layers:
        attn = block.attn
        qkv = linear(attn.qkv, rms(x, block.attn_norm.weight, eps))
        q = qkv[:, : H * D].view(N, H, D)
        k = qkv[:, H * D : (H + Hkv) * D].view(N, Hkv, D)
        v = qkv[:, (H + Hkv) * D :].view(N, Hkv, D)
        if attn.q_norm is not None:
            q, k = rms(q, attn.q_norm.weight, eps), rms(k, attn.k_norm.weight, eps)
        rot = model.rope_local if attn.window and model.rope_local is not None else model.rope
        q, k = rope(q, rot.cos[:N], rot.sin[:N]), rope(k, rot.cos[:N], rot.sin[:N])
        k, v = k.repeat_interleave(H // Hkv, dim=1), v.repeat_interleave(H // Hkv, dim=1)  # (N, H, D)
        s = torch.einsum("phd,jhd->hpj", q, k) * attn.scale
        seen = (p[None] <= p[:, None]) & ((p[:, None] - p[None] < attn.window) if attn.window else True)
        a = torch.einsum("hpj,jhd->phd", s.masked_fill(~seen, -math.inf).softmax(-1), v).reshape(N, H * D)
        y = linear(attn.o, a)
        x = x + (rms(y, block.attn_post_norm.weight, eps) if block.attn_post_norm is not None else y)
        g, u = linear(block.mlp.gate_up, rms(x, block.mlp_norm.weight, eps)).chunk(2, dim=-1)
        act = F.gelu(g, approximate="tanh") if block.mlp.activation == "gelu_tanh" else F.silu(g)
        y = linear(block.mlp.down, act * u)
        x = x + (rms(y, block.mlp_post_norm.weight, eps) if block.mlp_post_norm is not None else y)
    return rms(x, model.norm.weight, eps)


# ---- the stack ---------------------------------------------------------------------------------------------------
def run(stack: QuantStack, model: Transformer, x: torch.Tensor, widths: list[int], scatter: bool = False,
        kv: torch.dtype = torch.float32) -> torch.Tensor:
    """x (N, C) fed to the stack in passes of the given widths (sum N). scatter: another sequence takes blocks in
    between, so the stack reads this one's keys through its slot list."""
    cfg = model.cfg
    mgr = BlockManager(2 * MAX_LEN // 16, 16, MAX_LEN)
    pool = KVPool(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, mgr, kv, "cpu")
    mgr.allocate(0)
    if scatter:
        mgr.allocate(1)
    out, i = [], 0
    for w in widths:
        start, end = mgr.append(0, w)
        if scatter:
            mgr.append(1, 4)
        out.append(stack(x[i : i + w], start, pool.view(0, start, end)))
        i += w
    assert i == len(x)
    return torch.cat(out)


@pytest.fixture(scope="module")
def gguf(tmp_path_factory):
    """A tiny Llama with head_dim 16 (rotary_dim 12 leaves 4 dims unturned), three layers, Q8_0 matrices."""
    tok = make_tokenizer()
    hf = make_hf_model("llama", len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                       max_position_embeddings=MAX_LEN)
    return write_gguf(tmp_path_factory.mktemp("f") / "llama.gguf", hf, tok, "Q8_0"), len(tok)


def model_with(gguf, feat: Features, act: str = "fp32") -> Transformer:
    return give(build_model(GGUFFile(gguf[0]), MAX_LEN, act=act), feat)


def embeddings(model: Transformer, vocab: int, n: int, seed: int = 3) -> torch.Tensor:
    ids = torch.randint(0, vocab, (n,), generator=torch.Generator().manual_seed(seed))
    return model.embed(ids).float()  # (n, C)


FEATURES = {
    "qk_norm": Features(qk_norm=True),
    "sandwich": Features(sandwich=True),
    "gelu_tanh": Features(activation="gelu_tanh"),
    "window": Features(window=5),
    "window_local_rope": Features(window=6, windowed=(True, False, True), local_theta=10.0),
    "partial_rotary": Features(rotary_dim=12),
    "scale": Features(scale=0.11),
    "gemma3": Features(qk_norm=True, sandwich=True, activation="gelu_tanh", window=7, windowed=(True, True, False),
                       local_theta=10.0, scale=0.2),
}
# what each feature is compared without, to show the comparison sees it
WITHOUT = {
    "qk_norm": Features(), "sandwich": Features(), "gelu_tanh": Features(), "window": Features(window=6),
    "window_local_rope": Features(window=6, windowed=(True, False, True)), "partial_rotary": Features(),
    "scale": Features(), "gemma3": Features(qk_norm=True, sandwich=True, activation="gelu_tanh", window=7,
                                            windowed=(True, True, False), scale=0.2),
}
WIDTHS = [1, 3, 16, 2, 1, 9]  # 32 positions: every window is crossed, inside passes and between them


@pytest.mark.parametrize("name", list(FEATURES))
def test_each_feature_is_the_reference(gguf, name):
    model = model_with(gguf, FEATURES[name])
    stack = QuantStack(model)
    x = embeddings(model, gguf[1], sum(WIDTHS))
    fast = run(stack, model, x, WIDTHS)
    ref = reference(model, x)
    torch.testing.assert_close(fast.double(), ref, rtol=1e-4, atol=1e-4)
    other = reference(give(model, WITHOUT[name]), x)
    assert (other - ref).abs().max() > 1e-2, "the comparison does not see the feature"


@pytest.mark.parametrize("kv", [torch.float32, torch.float16], ids=["kv32", "kv16"])
@pytest.mark.parametrize("act", ["int8", "fp32"])
def test_features_are_batch_invariant(gguf, act, kv):
    """Rows of a T-row pass are the rows computed one at a time, windows crossing the passes, over contiguous and
    scattered blocks."""
    model = model_with(gguf, FEATURES["gemma3"], act)
    stack = QuantStack(model)
    x = embeddings(model, gguf[1], 32)
    steps = run(stack, model, x, [1] * 32, kv=kv)
    for widths in ([16, 16], WIDTHS, [5, 11, 7, 9]):
        assert torch.equal(run(stack, model, x, widths, kv=kv), steps), widths
    assert torch.equal(run(stack, model, x, [7, 16, 9], scatter=True, kv=kv), steps)


def test_features_give_the_same_bits_on_every_isa_and_thread_count(gguf):
    model = model_with(gguf, FEATURES["gemma3"], "int8")
    stack = QuantStack(model)
    x = embeddings(model, gguf[1], 32)
    outs = outputs_per_isa_and_threads(lambda: run(stack, model, x, [7, 16, 9], scatter=True, kv=torch.float16))
    first = next(iter(outs.values()))
    assert len(outs) >= 2 and all(torch.equal(first, y) for y in outs.values()), list(outs)


@pytest.fixture(scope="module")
def wide_gguf(tmp_path_factory):
    """head_dim 64 (the attention's compiled-width path) for windows across key chunks (csrc/attend.h: 128 keys)."""
    tok = make_tokenizer()
    hf = make_hf_model("llama", len(tok), hidden_size=256, num_attention_heads=4, num_key_value_heads=2,
                       num_hidden_layers=2, max_position_embeddings=MAX_LEN)
    return write_gguf(tmp_path_factory.mktemp("w") / "llama.gguf", hf, tok, "Q8_0"), len(tok)


@pytest.mark.parametrize("window", [100, 128, 200])
def test_windows_across_key_chunks(wide_gguf, window):
    """300 positions, then passes: each query's window starts inside one chunk and ends in another, and whole chunks
    lie before it; the passes equal one-token steps and the reference."""
    model = model_with(wide_gguf, Features(window=window, windowed=(True, False), local_theta=50.0))
    stack = QuantStack(model)
    x = embeddings(model, wide_gguf[1], 316)
    prompt = [16] * 18 + [12]  # 300 positions
    steps = run(stack, model, x, prompt + [1] * 16, scatter=True)
    assert torch.equal(run(stack, model, x, prompt + [16], scatter=True), steps)
    assert torch.equal(run(stack, model, x, prompt + [3, 9, 4]), steps)
    torch.testing.assert_close(steps.double(), reference(model, x), rtol=1e-4, atol=1e-4)


# ---- the activation on its own -------------------------------------------------------------------------------------
def gate_up(T: int, I: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(5)
    g = torch.cat([torch.linspace(-12, 12, T * I // 2), torch.randn(T * I - T * I // 2, generator=gen) * 3])
    return torch.cat([g.view(T, I), torch.randn(T, I, generator=gen)], dim=1)  # (T, 2I)


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_activations_are_torchs(activation):
    """To float rounding: the product of a few ulp-exact steps; torch's own tanh form rounds 1 + tanh(u) near -1 to
    multiples of 2^-24, hence the absolute term."""
    kernels = ext.load()
    gu = gate_up(16, 512)
    g, u = gu.chunk(2, dim=1)
    torch_act = F.gelu(g, approximate="tanh") if activation == "gelu_tanh" else F.silu(g)
    g64 = g.double()
    exact = (0.5 * g64 * (1 + torch.tanh(math.sqrt(2 / math.pi) * (g64 + 0.044715 * g64**3)))
             if activation == "gelu_tanh" else g64 * torch.sigmoid(g64)) * u.double()
    out = kernels.gated(gu, activation)
    torch.testing.assert_close(out.double(), exact, rtol=2e-6, atol=1e-12)
    torch.testing.assert_close(out, torch_act * u, rtol=2e-6, atol=1e-6)
    with pytest.raises(ValueError, match="silu, gelu_tanh"):
        kernels.gated(gu, "gelu")


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
def test_activations_are_row_wise_on_every_isa(activation):
    kernels = ext.load()
    gu = gate_up(16, 512)
    outs = outputs_per_isa_and_threads(lambda: kernels.gated(gu, activation, torch.get_num_threads()))
    first = next(iter(outs.values()))
    assert len(outs) >= 2 and all(torch.equal(first, y) for y in outs.values()), list(outs)
    assert torch.equal(torch.cat([kernels.gated(gu[t : t + 1], activation) for t in range(16)]), first)


# ---- what the stack cannot run falls back to the torch modules -----------------------------------------------------
def test_what_the_stack_cannot_run_is_refused(gguf):
    assert QuantStack.of(model_with(gguf, FEATURES["gemma3"])) is not None
    model = model_with(gguf, Features(activation="gelu"))  # the erf form: not the stack's
    assert QuantStack.of(model) is None
    model = model_with(gguf, Features())
    model.layers[1].attn.softcap = nn.Identity()  # a part the stack does not know
    assert QuantStack.of(model) is None
    model = model_with(gguf, Features())
    model.layers[0].post_norm = nn.Identity()
    assert QuantStack.of(model) is None
    model = model_with(gguf, Features())
    model.layers[2].attn.rotary_dim = 10  # layers that differ
    assert QuantStack.of(model) is None
    model = model_with(gguf, Features())
    model.layers[2].mlp.activation = "gelu_tanh"
    assert QuantStack.of(model) is None
    model = model_with(gguf, Features(rotary_dim=10))
    model.rope = Table(1e4, 12, MAX_LEN)  # a table of the wrong width
    assert QuantStack.of(model) is None
    model = model_with(gguf, Features(qk_norm=True))
    model.layers[0].attn.q_norm = nn.LayerNorm(model.cfg.head_dim)  # not an RMSNorm
    assert QuantStack.of(model) is None


def test_bad_features_raise_value_errors(gguf):
    model = model_with(gguf, Features())
    kernels, cfg = ext.load(), model.cfg
    stack = QuantStack(model)
    x = embeddings(model, gguf[1], 4)
    ok = run(stack, model, x, [4])
    stack_args = {"C": cfg.hidden_size, "H": cfg.num_heads, "Hkv": cfg.num_kv_heads, "D": cfg.head_dim,
                  "I": cfg.intermediate_size, "eps": cfg.rms_norm_eps, "cos": model.rope.cos, "sin": model.rope.sin,
                  "final_norm": model.norm.weight.detach(), "layers": []}
    with pytest.raises(ValueError, match="rotary_dim"):
        kernels.Stack(**stack_args, rotary_dim=7)
    with pytest.raises(ValueError, match="rotary tables"):
        kernels.Stack(**stack_args, rotary_dim=8)
    with pytest.raises(ValueError, match="silu, gelu_tanh"):
        kernels.Stack(**stack_args, activation="relu")
    with pytest.raises(ValueError, match="scale"):
        kernels.Stack(**stack_args, attn_scale=-1.0)
    with pytest.raises(ValueError, match="features for 1 layers"):
        kernels.Stack(**stack_args, features=[(None, None, None, None, 0, None, None)])
    assert torch.equal(run(stack, model, x, [4]), ok)


# ---- the torch modules of engine.model.transformer, and real GGUFs of the families ---------------------------------
def logits(model: Transformer, ids: list[int], widths: list[int], max_len: int = MAX_LEN) -> torch.Tensor:
    """(T, V) of ids fed to the model in passes of the given widths."""
    cfg = model.cfg
    mgr = BlockManager(max_len // 16, 16, max_len)
    pool = KVPool(cfg.num_layers, cfg.num_kv_heads, cfg.head_dim, mgr, torch.float32, "cpu")
    mgr.allocate(0)
    out, i = [], 0
    for w in widths:
        start, end = mgr.append(0, w)
        out.append(model(torch.tensor(ids[i : i + w]), start, pool.view(0, start, end)))
        i += w
    return torch.cat(out)


def featured(gguf, cfg_features: dict) -> Transformer:
    """A Transformer built for a config with the features, holding the tiny GGUF's quantized layers and random
    weights for the norms it adds."""
    base = build_model(GGUFFile(gguf[0]), MAX_LEN, act="fp32")
    cfg: ModelConfig = replace(base.cfg, **cfg_features)
    model = Transformer(cfg, MAX_LEN)
    gen = torch.Generator().manual_seed(11)
    model.embed, model.lm_head, model.norm = base.embed, base.lm_head, base.norm
    for new, old in zip(model.layers, base.layers):
        new.attn_norm, new.mlp_norm = old.attn_norm, old.mlp_norm
        new.attn.qkv, new.attn.o, new.mlp.gate_up, new.mlp.down = old.attn.qkv, old.attn.o, old.mlp.gate_up, old.mlp.down
        for owner, name in ((new.attn, "q_norm"), (new.attn, "k_norm"), (new, "attn_post_norm"), (new, "mlp_post_norm")):
            m = getattr(owner, name)
            if m is not None:
                m.weight = nn.Parameter(0.5 + torch.rand(m.weight.shape, generator=gen), requires_grad=False)
    model.stack = QuantStack.of(model)
    return model.eval()


GEMMA3_LIKE = {"qk_norm": True, "sandwich_norm": True, "activation": "gelu_tanh", "sliding_window": 7,
               "window_layers": (True, True, False), "rope_local_theta": 10.0, "attn_scale": 0.2}
PHI_LIKE = {"rotary_dim": 12, "sliding_window": 5, "window_layers": (True, True, True)}


@pytest.mark.parametrize("features", [GEMMA3_LIKE, PHI_LIKE], ids=["gemma3", "phi"])
def test_the_stack_is_the_transformer_modules(gguf, features):
    """engine.model.transformer's own modules for a config with the features: the stack's passes equal them up to the
    order of sums, and equal their own one-token steps bit for bit."""
    model = featured(gguf, features)
    assert model.stack is not None
    ids = torch.randint(0, gguf[1], (32,), generator=torch.Generator().manual_seed(2)).tolist()
    fast = logits(model, ids, WIDTHS)
    assert torch.equal(logits(model, ids, [1] * 32), fast)
    model.stack = None
    torch.testing.assert_close(fast, logits(model, ids, WIDTHS), rtol=1e-4, atol=1e-4)
    assert fast.abs().max() > 1e-2


def test_llama_cpp_converted_families_run_on_the_stack(family):
    """Qwen3, Gemma 3 and Phi-3 GGUFs written by llama.cpp's converter (tests/engine/test_gguf_families.py): the stack
    takes them, its passes are its steps bit for bit with windows crossing, and the torch modules agree."""
    name, _, _, path = family
    model = build_model(GGUFFile(path), 64, act="int8")
    assert model.stack is not None, name
    steps = logits(model, IDS, [1] * len(IDS), 64)
    assert torch.equal(logits(model, IDS, [16, 16, 8], 64), steps), name
    assert torch.equal(logits(model, IDS, [3, 9, 11, 2, 15], 64), steps), name
    model = build_model(GGUFFile(path), 64, act="fp32")
    fast = logits(model, IDS, [16, 16, 8], 64)
    model.stack = None
    torch.testing.assert_close(fast, logits(model, IDS, [16, 16, 8], 64), rtol=1e-4, atol=2e-4)


@pytest.mark.parametrize("name", list(HF_FAMILIES))
def test_transformers_families_on_the_dense_kernels_run_on_the_stack(name, tmp_path):
    """Each family of tests/engine/test_families_hf.py as a folder on the kernels' F32 units (engine.cpu.dense) with
    the stack: transformers' logits over a prefill, steps and verify passes crossing the windows."""
    hf = hf_model(HF_FAMILIES[name])
    hf.save_pretrained(tmp_path)
    model = place(load_checkpoint(tmp_path), torch.float32, torch.device("cpu"), 256, int8=False)
    assert model.stack is not None, name
    with torch.no_grad():
        ref = hf(torch.tensor([hf_ids()])).logits[0]
    torch.testing.assert_close(ours_by_passes(model), ref, atol=HF_ATOL, rtol=0)
