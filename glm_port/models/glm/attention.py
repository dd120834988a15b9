"""GLM's attention mask and the two ways to apply it.

GLM hands the transformer its mask in one of two forms:

- ``sep`` form: one integer per sample (or one for the whole batch). Key columns ``< sep`` (Part A,
  the corrupted text) are visible to every query; the rest (Part B, the spans) is causal.
- full form: a float tensor ``[b or 1, 1, q, k]`` with 1 where a query may attend.

``visibility_mask`` turns either into one boolean ``[b, 1, q, m + q]`` tensor per batch (``m`` memory
positions in front, always visible). ``fused_attention`` feeds it to shim's fused attention (torch's
SDPA kernels on CUDA; on CPU with dropout, shim's blocked kernel, as SDPA has no fused one there);
``sdpa_attention`` to torch's SDPA as it is; ``masked_attention`` is upstream's explicit formula,
kept as the reference the fast paths are tested against.
"""

from __future__ import annotations

import math

import shim as torch
import shim.nn.functional as F

# Upstream writes masked scores as ``scores * mask - 65504 * (1 - mask)`` (65504: fp16's max).
MASKED_SCORE = -65504.0


def is_sep_form(attention_mask: torch.Tensor, batch_size: int) -> bool:
    """As upstream: one number per sample (any shape) or one for all; the full form is 4-D. The rank is
    tested first: a 4-D mask's size is never compared (an exported graph's sizes stay dynamic)."""
    return attention_mask.dim() < 4 and attention_mask.numel() in (1, batch_size)


def visibility_mask(
    attention_mask: torch.Tensor | None, batch_size: int, query_length: int, memory_length: int = 0,
    cached_length: int = 0, device=None,
) -> torch.Tensor:
    """Boolean ``[b, 1, q, m + c + q]`` mask (True = may attend) from either mask form, or ``None`` (all seen).

    ``memory_length`` (``m``): upstream's ``mems`` in front, always visible; ``sep`` counts from after them.
    ``cached_length`` (``c``): a key/value cache's positions in front; ``sep`` counts them (keys before
    ``sep``, cached ones included, are seen by every query), and the queries are positions ``c..c+q-1``.
    ``device``: where the all-visible mask of ``None`` goes.
    """
    keys = memory_length + cached_length + query_length
    if attention_mask is None:
        return torch.ones(batch_size, 1, query_length, keys, dtype=torch.bool, device=device)
    if not is_sep_form(attention_mask, batch_size):
        # Full form: the last m + c + q columns describe memory, the cache and the current segment.
        return attention_mask[..., -keys:].bool().expand(batch_size, -1, -1, -1)
    device = attention_mask.device
    sep = attention_mask.reshape(-1, 1, 1).expand(batch_size, 1, 1).long()
    rows = torch.arange(cached_length, cached_length + query_length, device=device).view(1, -1, 1)
    cols = torch.arange(cached_length + query_length, device=device).view(1, 1, -1)
    visible = (cols <= rows) | (cols < sep)  # causal, plus Part A seen by everyone
    if memory_length:
        memory = torch.ones(batch_size, query_length, memory_length, dtype=torch.bool, device=device)
        visible = torch.cat((memory, visible), dim=-1)
    return visible.unsqueeze(1)


def fused_attention(q, k, v, visible: torch.Tensor, dropout_p: float = 0.0) -> torch.Tensor:
    """Attention through ``shim.nn.functional.fused_masked_attention``; shapes as ``sdpa_attention``."""
    return F.fused_masked_attention(q, k, v, visible, dropout_p)


def sdpa_attention(q, k, v, visible: torch.Tensor, dropout_p: float = 0.0) -> torch.Tensor:
    """Attention through ``scaled_dot_product_attention``; q ``[b, n, q, d]``, k/v ``[b, n, k, d]``."""
    return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, dropout_p=dropout_p)


def masked_attention(q, k, v, visible: torch.Tensor, dropout_p: float = 0.0) -> torch.Tensor:
    """Upstream GLM's formula, step by step: scale, ``scores*mask - 65504*(1-mask)``, softmax, dropout."""
    mask = visible.to(q.dtype)
    scores = torch.matmul(q, k.transpose(-1, -2) / math.sqrt(q.size(-1)))
    scores = scores * mask + MASKED_SCORE * (1.0 - mask)
    probs = F.dropout(torch.softmax(scores, dim=-1), p=dropout_p)
    return torch.matmul(probs, v)


ATTENTION_IMPLS = {"fused": fused_attention, "sdpa": sdpa_attention, "explicit": masked_attention}
