"""Megatron's fused softmax kernels (``scaled_masked_softmax_cuda``, ``scaled_upper_triang_masked_softmax_cuda``).

Their documented math, which these functions keep:

- ``scaled_masked_softmax``: ``x`` is ``[b, np, sq, sk]``, ``mask`` is ``[b or 1, 1, sq, sk]`` with
  1 (True) at masked positions. Each score is ``x * scale``, a masked one is set to ``-10000.0``
  (after scaling, not scaled), then softmax over the last dimension. A fully masked row is
  therefore uniform, as in the kernel.
- ``scaled_upper_triang_masked_softmax``: ``x`` is ``[batches, sq, sk]`` with ``sq == sk``; column
  ``j > i`` of row ``i`` is left out of the softmax and its probability is exactly 0 (the causal mask).
- Backward of both, from the saved probabilities ``p``: ``dx = scale * p * (dy - sum(dy * p, -1))``.

The kernels take fp16/bf16 inputs and do their arithmetic in fp32, returning the input's dtype; so
do these (any float dtype is accepted: fp32 in, fp32 out). ``torch.softmax(..., dtype=float32)``
reads half inputs without a separate fp32 copy of them.
"""

from __future__ import annotations

import torch

__all__ = ['MASKED_VALUE', 'scaled_masked_softmax_forward', 'causal_mask', 'scaled_upper_triang_masked_softmax_forward', 'scaled_softmax_backward', 'ScaledMaskedSoftmax', 'ScaledUpperTriangMaskedSoftmax', 'scaled_masked_softmax', 'scaled_upper_triang_masked_softmax', 'batch_per_block']

MASKED_VALUE = -10000.0  # what the kernel writes for a masked score (after scaling)


def _acc(x: torch.Tensor) -> torch.dtype:
    """The kernels' accumulation type: fp32 (float64 inputs, which the kernels refuse, keep float64)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _check(x: torch.Tensor, dims: int, name: str) -> None:
    if x.dim() != dims:
        raise ValueError(f"{name}: expected a {dims}-D tensor, got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"{name}: expected a floating-point tensor, got {x.dtype}")


def scaled_masked_softmax_forward(x: torch.Tensor, mask: torch.Tensor, scale: float) -> torch.Tensor:
    """The kernel's forward: softmax(x * scale, masked to -10000) in fp32, returned in x's dtype."""
    _check(x, 4, "scaled_masked_softmax")
    if mask.dim() != 4:
        raise ValueError(f"scaled_masked_softmax: expected a 4-D mask, got shape {tuple(mask.shape)}")
    scores = x.to(_acc(x)) * float(scale)
    scores = scores.masked_fill_(mask.bool(), MASKED_VALUE)
    return torch.softmax(scores, dim=-1).to(x.dtype)


def causal_mask(sq: int, sk: int, device) -> torch.Tensor:
    """True above the diagonal: the columns row ``i`` may not see."""
    return torch.ones(sq, sk, dtype=torch.bool, device=device).triu_(1)


def scaled_upper_triang_masked_softmax_forward(x: torch.Tensor, scale: float) -> torch.Tensor:
    """The kernel's forward: causal softmax of x * scale in fp32 (masked entries exactly 0), x's dtype."""
    _check(x, 3, "scaled_upper_triang_masked_softmax")
    if x.shape[1] != x.shape[2]:
        raise ValueError(f"scaled_upper_triang_masked_softmax: expected sq == sk, got shape {tuple(x.shape)}")
    scores = x.to(_acc(x)) * float(scale)
    scores = scores.masked_fill_(causal_mask(x.shape[1], x.shape[2], x.device), float("-inf"))
    return torch.softmax(scores, dim=-1).to(x.dtype)


def scaled_softmax_backward(grad: torch.Tensor, probs: torch.Tensor, scale: float) -> torch.Tensor:
    """Both kernels' backward: ``scale * p * (dy - sum(dy * p))`` in fp32, returned in dy's dtype."""
    p = probs.to(_acc(grad))
    g = grad.to(_acc(grad))
    dx = g.mul_(p) if g is not grad else g * p
    dx = dx.sub_(p * dx.sum(dim=-1, keepdim=True)).mul_(float(scale))
    return dx.to(grad.dtype)


def _scale_value(scale) -> float:
    return float(scale.item() if isinstance(scale, torch.Tensor) else scale)


class ScaledMaskedSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, mask, scale):
        scale = _scale_value(scale)
        probs = scaled_masked_softmax_forward(x, mask, scale)
        ctx.scale = scale
        ctx.save_for_backward(probs)
        return probs

    @staticmethod
    def backward(ctx, grad):
        (probs,) = ctx.saved_tensors
        return scaled_softmax_backward(grad, probs, ctx.scale), None, None


class ScaledUpperTriangMaskedSoftmax(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        scale = _scale_value(scale)
        probs = scaled_upper_triang_masked_softmax_forward(x, scale)
        ctx.scale = scale
        ctx.save_for_backward(probs)
        return probs

    @staticmethod
    def backward(ctx, grad):
        (probs,) = ctx.saved_tensors
        return scaled_softmax_backward(grad, probs, ctx.scale), None


def scaled_masked_softmax(x: torch.Tensor, mask: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Differentiable ``softmax(x * scale)`` with 1/True in ``mask`` set to -10000 (Megatron's padding kernel)."""
    return ScaledMaskedSoftmax.apply(x, mask, scale)


def scaled_upper_triang_masked_softmax(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """Differentiable causal ``softmax(x * scale)`` over ``[batches, sq, sq]`` (Megatron's causal kernel)."""
    return ScaledUpperTriangMaskedSoftmax.apply(x, scale)


def batch_per_block(sq: int, sk: int, b: int, np: int) -> int:
    """``get_batch_per_block`` as the CUDA kernel computes it (its launch geometry, 32-wide warps,
    128 threads a block). Megatron's ``FusedScaleMaskSoftmax`` uses it only to decide whether the
    kernel may run."""
    next_power_of_two = 1 << max(int(sk) - 1, 0).bit_length()
    warp_size = min(next_power_of_two, 32)
    batches_per_warp = 2 if next_power_of_two <= 128 else 1
    return (128 // warp_size) * batches_per_warp
