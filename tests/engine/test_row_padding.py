"""Short passes padded to one row count (engine.model.row_padding): what a GPU needs for a verify pass's rows to
equal plain steps' bit for bit, checked here on the CPU with dense fp32 weights; tests/engine/test_cuda.py checks it
on a GPU."""
from __future__ import annotations

import torch
from torch import nn

from engine.model.row_padding import RowPadded, pad_short_passes, rows_depend_on_count
from engine.model.transformer import Transformer
from tests.tiny import QWEN2_TINY, hf_model, model_config, pass_and_steps, state_dict


def test_a_padded_module_returns_its_rows_and_sees_the_fixed_count():
    seen = []
    lin = nn.Linear(8, 3)
    padded = RowPadded(nn.Sequential(nn.Identity(), lin), rows=6)
    padded.inner[0].register_forward_hook(lambda m, i, o: seen.append(i[0].shape[0]))
    x = torch.randn(4, 8)
    assert torch.equal(padded(x), lin(torch.cat([x, torch.zeros(2, 8)]))[:4])
    assert padded(torch.randn(9, 8)).shape == (9, 3)  # longer than the fixed count: as it is
    assert seen == [6, 9]


class Scale(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.rand(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight


class CountAware(nn.Linear):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) + 1e-3 * (x.shape[0] == 1)  # as if one row ran another kernel


def test_the_probe_tells_which_modules_round_differently_with_fewer_rows():
    assert not rows_depend_on_count(Scale(64))
    assert rows_depend_on_count(CountAware(64, 8))


def test_a_padded_model_scores_a_pass_exactly_as_one_token_at_a_time():
    cfg = dict(QWEN2_TINY, hidden_size=128, intermediate_size=320, vocab_size=512)
    model = Transformer.from_state_dict(model_config(cfg), state_dict(hf_model(cfg, 5)), torch.float32, "cpu", 256)
    # Which modules need it is the machine's (here torch's CPU matmul rounds one row otherwise than several)
    pad_short_passes(model)
    prompt, ids = [1, 7, 40, 3, 99, 12, 250], [17, 300, 4, 81, 5]
    together, one_by_one = pass_and_steps(model, prompt, ids)
    assert together.shape == (5, 512)
    assert torch.equal(together, one_by_one)
