"""Scaled dot-product attention with a boolean mask and attention dropout, fast on CPU.

``fused_masked_attention(q, k, v, visible, dropout_p)`` is ``softmax(q k^T / sqrt(d), masked) -> dropout
-> @ v``. Without dropout, and on CUDA, it is torch's ``scaled_dot_product_attention`` (fused kernels).
On CPU with dropout, SDPA has no fused kernel and takes its math path: some fifteen passes over
``[b, n, q, k]`` float tensors too large for the cache, a ``bernoulli_`` mask and ``masked_fill``s
(GLM base, one layer forward + backward, 1 thread: about 2.5x the time without dropout;
``bench/attention.py``). Here the same math runs a block of heads of one sample at a time, so each
block's scores stay in cache from the matmul to the value matmul: the scale and the mask ride in the
score matmul (``baddbmm`` onto an additive mask), the dropout mask comes from
:func:`shim.ops.dropout_mask.keep_mask` and is applied by multiplication, and backward reuses the
saved probabilities and mask.

A query row with no visible key attends uniformly to all keys (masked scores are the dtype's most
negative finite value, as upstream GLM's ``-65504`` fill), where SDPA's CPU path returns zeros.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from shim.ops.dropout_mask import apply_keep, keep_mask

__all__ = ["BLOCK_ELEMENTS", "fused_masked_attention"]

# Scores per block, in elements: 512 Ki floats (2 MiB) keeps a block's passes in a 2-core machine's
# cache and amortises the Python loop (bench/attention.py --block-elements).
BLOCK_ELEMENTS = 512 * 1024


def fused_masked_attention(q, k, v, visible: torch.Tensor, dropout_p: float = 0.0,
                           block_elements: int = BLOCK_ELEMENTS) -> torch.Tensor:
    """Attention of q ``[b, n, sq, d]`` over k, v ``[b, n, sk, d]``; ``visible`` bool, broadcastable
    to ``[b, n, sq, sk]``, True where a query may attend. ``dropout_p`` drops attention weights."""
    if not 0.0 <= dropout_p <= 1.0:
        raise ValueError(f"fused_masked_attention: dropout probability must be in [0, 1], got {dropout_p}")
    if visible.dtype != torch.bool:
        raise TypeError(f"fused_masked_attention: visible must be a bool mask, got {visible.dtype}")
    if (any(t.dim() != 4 for t in (q, k, v)) or k.shape[:2] != q.shape[:2] or k.size(-1) != q.size(-1)
            or v.shape[:3] != k.shape[:3]):
        raise ValueError(
            "fused_masked_attention: q, k, v must be [b, n, sq, d], [b, n, sk, d], [b, n, sk, dv]; got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    if dropout_p == 0.0 or q.device.type != "cpu":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=visible, dropout_p=dropout_p)
    if torch.is_autocast_enabled("cpu"):  # as autocast runs SDPA: in its lower precision
        dtype = torch.get_autocast_dtype("cpu")
        q, k, v = (t.to(dtype) for t in (q, k, v))
    with torch.autocast("cpu", enabled=False):
        return _BlockedAttention.apply(q, k, v, visible, dropout_p, block_elements)


class _BlockedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, visible, p, block_elements):
        b, n, sq, _ = q.shape
        sk = k.size(2)
        scale = 1.0 / math.sqrt(q.size(-1))
        keep_scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
        # Additive mask: 0 where visible, the most negative finite value elsewhere; broadcast, not copied.
        masked = torch.zeros(visible.shape, dtype=q.dtype).masked_fill_(~visible, torch.finfo(q.dtype).min)
        masked = masked.expand(b, n, sq, sk)
        probs = q.new_empty(b, n, sq, sk)
        keep = keep_mask(probs.shape, p)
        out = q.new_empty(b, n, sq, v.size(-1))
        for block in _blocks(b, n, sq * sk, block_elements):
            scores = torch.baddbmm(masked[block], q[block], k[block].transpose(-1, -2), alpha=scale)
            torch.softmax(scores, -1, out=probs[block])
            kept = apply_keep(probs[block], keep[block], out=scores)
            torch.matmul(kept, v[block], out=out[block])
        out.mul_(keep_scale)
        ctx.save_for_backward(q, k, v, probs, keep)
        ctx.scale, ctx.keep_scale, ctx.block_elements = scale, keep_scale, block_elements
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        saved = ctx.saved_tensors  # once: activation checkpointing refuses a second unpack
        with torch.autocast("cpu", enabled=False):
            return _BlockedAttention._backward(ctx, grad_out.to(saved[0].dtype), *saved)

    @staticmethod
    def _backward(ctx, grad_out, q, k, v, probs, keep):
        dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype) for t in (q, k, v))
        b, n, sq, sk = probs.shape
        for block in _blocks(b, n, sq * sk, ctx.block_elements):
            kept = apply_keep(probs[block], keep[block], out=torch.empty_like(probs[block]))
            torch.matmul(kept.transpose(-1, -2), grad_out[block], out=dv[block])
            # d(probs) = dropout'(grad @ v^T); softmax backward: probs * (dp - sum(probs * dp)).
            dp = apply_keep(torch.matmul(grad_out[block], v[block].transpose(-1, -2)), keep[block])
            dp.mul_(probs[block])
            d_scores = dp.addcmul_(probs[block], dp.sum(-1, keepdim=True), value=-1.0)
            d_scores.mul_(ctx.scale * ctx.keep_scale)
            torch.matmul(d_scores, k[block], out=dq[block])
            torch.matmul(d_scores.transpose(-1, -2), q[block], out=dk[block])
        dv.mul_(ctx.keep_scale)
        return dq, dk, dv, None, None, None


def _blocks(batch: int, heads: int, elements_per_head: int, block_elements: int):
    """Index tuples ``(sample, heads slice)``: each block is some heads of one sample."""
    step = max(1, min(heads, block_elements // elements_per_head))
    for sample in range(batch):
        for start in range(0, heads, step):
            yield sample, slice(start, min(start + step, heads))
