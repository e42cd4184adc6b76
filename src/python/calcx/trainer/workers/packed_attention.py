"""Attention over packed rows that stays inside each row (transformers' `calcx_varlen`).

verl packs a micro-batch's rows end to end into one sequence (`use_remove_padding`) and marks
where each row starts by restarting its position ids at 0. Under transformers' `sdpa` that becomes
a (T, T) block-diagonal boolean mask over the whole micro-batch, and SDPA with an arbitrary mask can
neither use flash attention nor skip the masked blocks: time and memory grow with the square of
the micro-batch's tokens instead of each row's. Here the row boundaries come from the position ids
and torch's own variable-length flash attention (`torch.nn.attention.varlen`, CUDA, torch >= 2.10)
attends within each row. Where that kernel is missing (CPU, a GPU older than Ampere, an older
torch) each row goes through SDPA on its own: the same result, slower.

verl imports this module in every process that builds the model, through
`actor_rollout_ref.model.external_lib` (calcx.yaml), before it reads `attn_implementation`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F

ATTN_IMPLEMENTATION = "calcx_varlen"
# where the row boundaries of one forward pass are kept: every layer gets the same position ids
_SEGMENTS_ATTR = "_calcx_segments"


def row_segments(position_ids: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(cumulative row starts as int32 with the total at the end, longest row) of one packed row.

    A row starts wherever its position id is 0 (and at the first token, whatever its id). Computed
    once a forward pass: the result rides on the position-id tensor all layers share.
    """
    cached = getattr(position_ids, _SEGMENTS_ATTR, None)
    if cached is not None:
        return cached
    flat = position_ids.reshape(-1)
    total = flat.numel()
    starts = torch.nonzero(flat == 0).flatten()
    if starts.numel() == 0 or int(starts[0]) != 0:
        starts = torch.cat([starts.new_zeros(1), starts])
    cu = torch.cat([starts, starts.new_tensor([total])]).to(torch.int32)
    result = (cu, int(cu.diff().max()))
    setattr(position_ids, _SEGMENTS_ATTR, result)
    return result


@lru_cache(maxsize=1)
def _flash_varlen() -> tuple[Callable[..., torch.Tensor], frozenset[str]] | None:
    """torch's variable-length flash attention and its keyword names, or None where torch lacks it."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn, frozenset(inspect.signature(varlen_attn).parameters)


def flash_varlen_usable(tensor: torch.Tensor) -> bool:
    """Flash attention runs here: torch has the varlen kernel, the tensor is half precision on an
    Ampere-or-newer CUDA GPU."""
    if _flash_varlen() is None or not tensor.is_cuda or tensor.dtype not in (torch.bfloat16, torch.float16):
        return False
    return torch.cuda.get_device_capability(tensor.device) >= (8, 0)


def _repeat_kv(key: torch.Tensor, value: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    groups = heads // key.shape[1]
    if groups == 1:
        return key, value
    return key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)


def varlen_causal_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    cu: torch.Tensor,
    max_len: int,
    scale: float | None = None,
) -> torch.Tensor:
    """Causal attention within each row of packed (T, heads, head_dim) tensors; (T, heads, head_dim).

    Key and value may have fewer heads than the query (grouped-query attention).
    """
    found = _flash_varlen() if flash_varlen_usable(query) else None
    if found is not None:
        varlen_attn, params = found
        kwargs: dict[str, Any] = {}
        # torch 2.10 spells causality `is_causal`; later versions a (left, right) window
        if "window_size" in params:
            kwargs["window_size"] = (-1, 0)
        else:
            kwargs["is_causal"] = True
        if scale is not None and "scale" in params:
            kwargs["scale"] = scale
        elif scale is not None and abs(scale - query.shape[-1] ** -0.5) > 1e-12:
            found = None  # this torch cannot scale otherwise than 1/sqrt(head_dim)
        if found is not None:
            if key.shape[1] != query.shape[1]:
                if "enable_gqa" in params:
                    kwargs["enable_gqa"] = True
                else:
                    key, value = _repeat_kv(key, value, query.shape[1])
            cu = cu.to(query.device)
            return varlen_attn(
                query.contiguous(), key.contiguous(), value.contiguous(), cu, cu, max_len, max_len, **kwargs
            )
    key, value = _repeat_kv(key, value, query.shape[1])
    out = torch.empty_like(query)
    bounds = cu.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        if end <= start:
            continue
        q, k, v = (t[start:end].transpose(0, 1).unsqueeze(0) for t in (query, key, value))
        part = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        out[start:end] = part.squeeze(0).transpose(0, 1)
    return out


def calcx_varlen_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention-interface signature: (batch, heads, T, head_dim) in,
    (batch, T, heads, head_dim) out. Packed training rows take the varlen path; anything else
    (a padding mask, several rows, a key-value cache, dropout) goes to transformers' SDPA."""
    position_ids = kwargs.get("position_ids")
    packed = (
        attention_mask is None
        and position_ids is not None
        and query.shape[0] == 1
        and query.shape[2] == key.shape[2]
        and position_ids.numel() == query.shape[2]
        and not dropout
    )
    if not packed:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    cu, max_len = row_segments(position_ids)
    out = varlen_causal_attention(
        query[0].transpose(0, 1), key[0].transpose(0, 1), value[0].transpose(0, 1), cu, max_len, scale=scaling
    )
    return out.unsqueeze(0), None


def calcx_varlen_mask(*args: Any, **kwargs: Any) -> torch.Tensor | None:
    """No mask for packed rows (their bounds come from the position ids); SDPA's mask otherwise."""
    if kwargs.get("attention_mask") is None:
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, **kwargs)


def register() -> None:
    """Make `attn_implementation: calcx_varlen` known to transformers in this process."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, calcx_varlen_attention)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, calcx_varlen_mask)


register()
