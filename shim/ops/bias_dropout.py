"""Bias add + dropout (+ residual): ``dropout(x + bias, p) + residual``, Megatron's bias-dropout-add.

Composed, this allocates the sum, the noise, the dropout output and the final sum, and
keeps the noise for backward as a float tensor (torch's CPU dropout draws it as floats).
Fused on CPU, the sum, the masking, the ``1/(1-p)`` scaling and the residual all land in
one output buffer; the only saved tensor is a bool keep-mask (one byte an element), drawn by
:func:`shim.ops.dropout_mask.keep_mask` (a fraction of ``bernoulli_``'s cost) from the default
generator, so ``torch.manual_seed`` makes it reproducible.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from shim.ops._cuda import compiled_on_first_use
from shim.ops.bias_act import bias_grad, check_bias
from shim.ops.dropout_mask import apply_keep, keep_mask

__all__ = ["fused_bias_add_dropout"]


def fused_bias_add_dropout(x, bias, p: float, training: bool = True, residual=None):
    """``dropout(x + bias, p, training) (+ residual)``; output dtype of ``x``.

    ``bias`` has shape ``[x.shape[-1]]``; ``residual``, if given, has ``x``'s shape and dtype.
    With ``training=False`` or ``p == 0`` no mask is drawn and no random numbers are consumed.
    """
    check_bias(x, bias, "fused_bias_add_dropout")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"fused_bias_add_dropout: dropout probability must be in [0, 1], got {p}")
    if residual is not None and (residual.shape != x.shape or residual.dtype != x.dtype):
        raise ValueError(
            f"fused_bias_add_dropout: residual ({tuple(residual.shape)}, {residual.dtype}) must match "
            f"x ({tuple(x.shape)}, {x.dtype})"
        )
    if not training or p == 0.0:
        out = x + bias
        return out if residual is None else out + residual
    if x.is_cuda:
        return _bias_dropout_cuda(x, bias, p, residual)
    return _BiasDropout.apply(x, bias, p, residual)


class _BiasDropout(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias, p, residual):
        # The mask is applied by multiplying by its bytes: ATen widens them to a transient of x's
        # dtype, and that is still several times faster than masked_fill_ (not vectorised on CPU).
        keep = keep_mask(x.shape, p)
        scale = 0.0 if p == 1.0 else 1.0 / (1.0 - p)
        out = apply_keep(torch.add(x, bias), keep)
        if residual is None:
            out.mul_(scale)
        else:
            torch.add(residual, out, alpha=scale, out=out)
        ctx.save_for_backward(keep)
        ctx.scale = scale
        ctx.bias_shape = bias.shape
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        (keep,) = ctx.saved_tensors
        grad_x = apply_keep(torch.mul(grad_out, ctx.scale), keep)
        grad_bias = bias_grad(grad_x, ctx.bias_shape) if ctx.needs_input_grad[1] else None
        grad_residual = grad_out if ctx.needs_input_grad[3] else None
        return grad_x, grad_bias, None, grad_residual


@compiled_on_first_use
def _bias_dropout_cuda(x, bias, p, residual):
    out = F.dropout(x + bias, p=p, training=True)
    return out if residual is None else out + residual
