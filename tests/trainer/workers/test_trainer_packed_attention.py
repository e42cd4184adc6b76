"""calcx_varlen: attention over packed rows stays inside each row, through transformers' own model.

On CPU the per-row SDPA path runs (the flash varlen kernel needs a CUDA GPU); `calcx
profile-step` checks the flash path against SDPA's block mask on the GPU. The keyword adaptation
to torch's `varlen_attn` is checked here against a stand-in with each torch version's signature.
"""

from __future__ import annotations

import pytest
import torch
from transformers import AutoConfig, Qwen2Config, Qwen2ForCausalLM

from calcx.trainer.workers import packed_attention
from calcx.trainer.workers.packed_attention import (
    ATTN_IMPLEMENTATION,
    calcx_varlen_mask,
    row_segments,
    varlen_causal_attention,
)

ROWS = [5, 9, 3, 7]


def tiny_qwen2(attn: str) -> Qwen2ForCausalLM:
    torch.manual_seed(0)
    config = Qwen2Config(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=97,
        max_position_embeddings=64,
    )
    config._attn_implementation = attn
    return Qwen2ForCausalLM(config).eval()


def packed(rows: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 97, (1, sum(rows)), generator=gen)
    positions = torch.cat([torch.arange(n) for n in rows]).unsqueeze(0)
    return ids, positions


def test_packed_rows_match_each_row_run_alone() -> None:
    model = tiny_qwen2(ATTN_IMPLEMENTATION)
    ids, positions = packed(ROWS)
    with torch.no_grad():
        together = model(input_ids=ids, position_ids=positions, use_cache=False).logits[0]
        start = 0
        for n in ROWS:
            alone = model(input_ids=ids[:, start : start + n]).logits[0]
            torch.testing.assert_close(together[start : start + n], alone, rtol=1e-4, atol=1e-5)
            start += n


def test_same_logits_and_gradients_as_sdpa_block_mask() -> None:
    ids, positions = packed(ROWS)
    out = {}
    for attn in ("sdpa", ATTN_IMPLEMENTATION):
        model = tiny_qwen2(attn).train()
        logits = model(input_ids=ids, position_ids=positions.clone(), use_cache=False).logits
        logits.float().logsumexp(-1).sum().backward()
        out[attn] = (logits.detach(), model.model.layers[0].self_attn.q_proj.weight.grad.clone())
    torch.testing.assert_close(out["sdpa"][0], out[ATTN_IMPLEMENTATION][0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(out["sdpa"][1], out[ATTN_IMPLEMENTATION][1], rtol=1e-4, atol=1e-5)


def test_rows_do_not_see_each_other() -> None:
    # changing the first row's tokens must leave every later row's logits as they were
    model = tiny_qwen2(ATTN_IMPLEMENTATION)
    ids, positions = packed(ROWS)
    other = ids.clone()
    other[0, : ROWS[0]] = (other[0, : ROWS[0]] + 1) % 97
    with torch.no_grad():
        a = model(input_ids=ids, position_ids=positions.clone(), use_cache=False).logits[0, ROWS[0] :]
        b = model(input_ids=other, position_ids=positions.clone(), use_cache=False).logits[0, ROWS[0] :]
    torch.testing.assert_close(a, b)


def test_padded_batches_still_use_sdpa_with_their_mask() -> None:
    model = tiny_qwen2(ATTN_IMPLEMENTATION)
    ids = torch.randint(0, 97, (2, 6), generator=torch.Generator().manual_seed(2))
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    reference = tiny_qwen2("sdpa")
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=mask).logits
        want = reference(input_ids=ids, attention_mask=mask).logits
    torch.testing.assert_close(got[:, 2:], want[:, 2:], rtol=1e-4, atol=1e-5)


def test_row_segments_from_position_ids() -> None:
    cu, longest = row_segments(torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]]))
    assert cu.tolist() == [0, 3, 5, 9] and cu.dtype == torch.int32 and longest == 4
    # a pack that does not start at position 0 still starts a row at its first token
    cu, longest = row_segments(torch.tensor([[4, 5, 0, 1]]))
    assert cu.tolist() == [0, 2, 4] and longest == 2


def test_row_segments_are_computed_once_per_position_tensor() -> None:
    positions = torch.tensor([[0, 1, 0, 1, 2]])
    first = row_segments(positions)
    positions[0, 2] = 7  # a later layer sees the same tensor: the bounds are not computed again
    assert row_segments(positions) is first


def test_mask_is_none_for_packed_rows_and_sdpa_otherwise() -> None:
    assert calcx_varlen_mask(batch_size=1, q_length=4, kv_length=4, attention_mask=None) is None
    mask = calcx_varlen_mask(
        batch_size=1, q_length=3, kv_length=3, attention_mask=torch.tensor([[0, 1, 1]]), allow_is_causal_skip=False
    )
    assert mask is not None and mask.shape == (1, 1, 3, 3) and not bool(mask[0, 0, 2, 0])


def test_verl_can_name_it_when_it_reads_the_model_config(tmp_path) -> None:
    tiny_qwen2("sdpa").config.save_pretrained(tmp_path)
    config = AutoConfig.from_pretrained(tmp_path, attn_implementation=ATTN_IMPLEMENTATION)
    assert config._attn_implementation == ATTN_IMPLEMENTATION


def _reference(q, k, v, cu):
    """Causal attention of each row alone, written out with SDPA."""
    k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
    v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    bounds = cu.tolist()
    parts = [
        torch.nn.functional.scaled_dot_product_attention(
            *(t[a:b].transpose(0, 1) for t in (q, k, v)), is_causal=True
        ).transpose(0, 1)
        for a, b in zip(bounds[:-1], bounds[1:])
    ]
    return torch.cat(parts)


@pytest.mark.parametrize("signature", ["torch-2.10", "torch-2.11", "torch-2.12"])
def test_flash_kernel_gets_causality_and_grouped_heads_in_each_torch_spelling(monkeypatch, signature) -> None:
    calls = []

    def stand_in(query, key, value, cu_q, cu_k, max_q, max_k, **kwargs):
        calls.append(dict(kwargs, heads=(query.shape[1], key.shape[1]), max=(max_q, max_k)))
        if key.shape[1] != query.shape[1]:
            assert kwargs.get("enable_gqa"), "grouped heads handed over without enable_gqa"
            key = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
            value = value.repeat_interleave(query.shape[1] // value.shape[1], dim=1)
        assert kwargs.get("is_causal") or kwargs.get("window_size") == (-1, 0), "attention not causal"
        return _reference(query, key, value, cu_q)

    params = {
        "torch-2.10": {"is_causal", "return_aux"},
        "torch-2.11": {"return_aux", "scale", "window_size"},
        "torch-2.12": {"return_aux", "scale", "window_size", "enable_gqa"},
    }[signature]
    monkeypatch.setattr(packed_attention, "_flash_varlen", lambda: (stand_in, frozenset(params)))
    monkeypatch.setattr(packed_attention, "flash_varlen_usable", lambda tensor: True)
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(12, 4, 8, generator=gen)
    k = torch.randn(12, 2, 8, generator=gen)
    v = torch.randn(12, 2, 8, generator=gen)
    cu = torch.tensor([0, 5, 12], dtype=torch.int32)
    got = varlen_causal_attention(q, k, v, cu, 7)
    torch.testing.assert_close(got, _reference(q, k, v, cu))
    assert calls[0]["max"] == (7, 7)
    expected_kv_heads = 2 if "enable_gqa" in params else 4
    assert calls[0]["heads"] == (4, expected_kv_heads)
