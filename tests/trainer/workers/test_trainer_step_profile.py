"""`calcx profile-step`'s CPU side: the step it builds, its FLOP count, its refusal without a GPU."""

from __future__ import annotations

import pytest

from calcx.trainer.workers import step_profile
from calcx.trainer.workers.step_profile import QWEN25_15B, micro_batches, row_lengths, update_flops


def test_rows_shaped_like_a_calcx_step() -> None:
    lengths = row_lengths(256, 290, seed=0)
    assert len(lengths) == 256 and min(lengths) >= 116 and max(lengths) <= 464
    assert 0.9 * 256 * 290 < sum(lengths) < 1.1 * 256 * 290
    assert row_lengths(256, 290, seed=0) == lengths  # the same step on every machine


@pytest.mark.parametrize("budget", [8192, 16384, 65536])
def test_micro_batches_hold_every_row_once_within_the_budget(budget) -> None:
    lengths = row_lengths(256, 290, seed=1)
    batches = micro_batches(lengths, budget)
    assert sorted(n for batch in batches for n in batch) == sorted(lengths)
    assert all(sum(batch) <= budget for batch in batches)
    # first fit wastes little: no more than one micro-batch beyond the minimum
    assert len(batches) <= -(-sum(lengths) // budget) + 1


def test_a_row_longer_than_the_budget_is_refused() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        micro_batches([100, 9000], 8192)


def test_flops_are_verls_six_n_t_plus_attention() -> None:
    class Config:
        hidden_size, num_attention_heads, num_hidden_layers = 1536, 12, 28

    assert update_flops(1_000, Config, [10, 20]) == 6 * 1_000 * 30 + 6 * (100 + 400) * 128 * 12 * 28
    assert QWEN25_15B["num_key_value_heads"] == 2 and QWEN25_15B["vocab_size"] == 151936


def test_no_gpu_is_a_clear_refusal(capsys, monkeypatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert step_profile.main([]) == 3
    assert "no CUDA GPU" in capsys.readouterr().err
