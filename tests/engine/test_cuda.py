"""The engine on a GPU (CUDA, bf16): exactness where the matmul library chooses its own kernels, and short passes
replayed as CUDA graphs (engine.model.step_graphs). CI has no GPU, so these run where one is lent (README, Tests)
and are reported as skipped everywhere else."""
from __future__ import annotations

import pytest
import torch

from engine.io.loading import load_engine
from engine.model.kv_cache import BlockManager, KVPool
from engine.model.step_graphs import StepGraphs
from engine.model.transformer import Transformer
from tests.engine.test_exactness import assert_exact_distribution, greedy_identity
from tests.tiny import (
    ENGINE_CFG,
    QWEN2_TINY,
    draft_weights,
    hf_model,
    model_config,
    pair_folders,
    pass_and_steps,
    state_dict,
    tiny_tokenizer,
)

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

# The embedded draft's widths (Qwen2.5-0.5B) over fewer layers: the matmul shapes the library really sees.
WIDE = dict(QWEN2_TINY, hidden_size=896, intermediate_size=4864, num_hidden_layers=4, num_attention_heads=14,
            num_key_value_heads=2, vocab_size=32768)


def wide_model() -> Transformer:
    return Transformer.from_state_dict(model_config(WIDE), state_dict(hf_model(WIDE, 7)), torch.bfloat16, "cuda", 512)


@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
def test_short_passes_score_each_row_exactly_as_a_step(graphs):
    model = wide_model()
    assert model.graphs is not None  # captured by default on a GPU
    if not graphs:
        model.graphs = None
    prompt = list(range(100, 140))
    for n in (2, 5, 9, 16):
        together, steps = pass_and_steps(model, prompt, list(range(1000 + n, 1000 + 2 * n)))
        assert together.device.type == "cuda" and together.shape == (n, WIDE["vocab_size"])
        assert torch.equal(together, steps), n
    if graphs:  # each fresh pool of pass_and_steps is new addresses; the last one ran one-token steps
        assert model.graphs.capture and (1, False) in model.graphs.captured


def test_a_replayed_graph_computes_what_its_passes_compute_uncaptured():
    model = wide_model()
    replayed, uncaptured = model.graphs, StepGraphs(capture=False)
    c = model.cfg
    out = {}
    for name, graphs in (("replayed", replayed), ("uncaptured", uncaptured)):
        model.graphs = graphs
        pool = KVPool(c.num_layers, c.num_kv_heads, c.head_dim, BlockManager(32, 16, 512), torch.bfloat16, "cuda")
        pool.manager.allocate(0)
        rows = []
        for ids in (list(range(100, 140)), [5], [6, 7, 8], [9], [10, 11]):  # the prompt's 40 rows run eagerly
            start, end = pool.manager.append(0, len(ids))
            rows.append(model(torch.tensor(ids, device="cuda"), start, pool.view(0, start, end)))
        out[name] = torch.cat(rows[1:])  # (7, V)
    assert replayed.capture and set(replayed.captured) == {(1, False), (2, False), (3, False)}
    # The same kernels either way; bitwise equality is not promised across capture, so it is reported by the
    # benchmark (scripts/bench/gpu.py) rather than asserted. What matters for exactness is asserted above.
    torch.testing.assert_close(out["replayed"], out["uncaptured"], rtol=1e-2, atol=1e-2)
    assert torch.equal(out["replayed"].argmax(-1), out["uncaptured"].argmax(-1))


@pytest.fixture(scope="module")
def gpu_engine(tmp_path_factory):
    engine = load_engine(*map(str, pair_folders(tmp_path_factory.mktemp("pair"))), device="cuda")
    assert engine.device.type == "cuda" and engine.dtype == torch.bfloat16
    return engine


@pytest.mark.parametrize("drafter", ["model", "ngram", "hybrid"])
@pytest.mark.parametrize("k", [1, 3, 8, 16])
def test_greedy_speculative_equals_plain_on_the_gpu(gpu_engine, drafter, k):
    _, accepted, _, _ = greedy_identity(gpu_engine, drafter, k)
    assert accepted > 0
    assert gpu_engine.target.graphs.capture and (1, False) in gpu_engine.target.graphs.captured
    if drafter == "model":
        assert gpu_engine.draft.graphs.capture and gpu_engine.draft.graphs.captured


def test_sampling_distribution_is_exact_on_the_gpu():
    cfg_dict = dict(ENGINE_CFG, num_hidden_layers=1)
    sd = state_dict(hf_model(cfg_dict, 3))
    cfg = model_config(cfg_dict)
    target = Transformer.from_state_dict(cfg, sd, torch.bfloat16, "cuda", 256)
    draft = Transformer.from_state_dict(cfg, draft_weights(sd, 0.05, 4), torch.bfloat16, "cuda", 256)
    assert_exact_distribution(target, draft, tiny_tokenizer(), "model", 1.0, 0.9, draws=6000)


@pytest.mark.parametrize("drafter", ["model", "ngram"])
def test_a_gguf_pair_is_dequantized_onto_the_gpu_and_stays_exact(tmp_path, drafter):
    from tests.engine.test_gguf_model import assert_greedy_identity, gguf_pair_engine
    from tests.engine.test_weights import make_tokenizer

    engine = gguf_pair_engine(make_tokenizer(), tmp_path, "cuda")
    assert engine.device.type == "cuda" and engine.target_pool.k.dtype == torch.bfloat16
    assert_greedy_identity(engine, drafter, (1, 4, 16))
