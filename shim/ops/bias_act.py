"""Bias add + GELU: GLM's ``gelu(x + bias)`` with the tanh approximation by default.

GLM's GELU is ``0.5 * t * (1 + tanh(0.7978845608028654 * t * (1 + 0.044715 * t * t)))``,
which is ``torch.nn.functional.gelu(t, approximate="tanh")``; ``approximate="none"`` gives
the erf form.

Composed, ``gelu(x + bias)`` allocates the sum and the output and keeps the sum for
backward. Fused on CPU, the sum is written into the output buffer and GELU runs there in
place (one activation-sized allocation instead of two); backward recomputes ``x + bias``
into the buffer that becomes the input gradient. It saves ``x`` where composed saves the
sum: the same size, but usually the caller's tensor is then the only copy alive.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from shim.ops._cuda import compiled_on_first_use

__all__ = ["bias_grad", "check_bias", "fused_bias_add_gelu"]

_APPROXIMATIONS = ("tanh", "none")


def fused_bias_add_gelu(x, bias, approximate: str = "tanh"):
    """``gelu(x + bias, approximate)`` with ``bias`` of shape ``[x.shape[-1]]``; output dtype of ``x``."""
    check_bias(x, bias, "fused_bias_add_gelu")
    if approximate not in _APPROXIMATIONS:
        raise ValueError(f"fused_bias_add_gelu: approximate must be one of {_APPROXIMATIONS}, got {approximate!r}")
    if x.is_cuda:
        return _bias_gelu_cuda(x, bias, approximate)
    return _BiasGelu.apply(x, bias, approximate)


def check_bias(x, bias, where: str) -> None:
    if not x.is_floating_point():
        raise TypeError(f"{where}: x must be floating point, got {x.dtype}")
    if bias.ndim != 1 or x.ndim == 0 or bias.shape[0] != x.shape[-1]:
        raise ValueError(f"{where}: bias shape {tuple(bias.shape)} must be [x.shape[-1]] for x of shape {tuple(x.shape)}")
    if bias.dtype != x.dtype:
        raise TypeError(f"{where}: bias dtype {bias.dtype} differs from x dtype {x.dtype}")
    if bias.device != x.device:
        raise ValueError(f"{where}: x on {x.device} but bias on {bias.device}")


def bias_grad(grad, bias_shape):
    """The bias gradient: ``grad`` summed over every dim but the last."""
    return grad.reshape(-1, bias_shape[0]).sum(0)


class _BiasGelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, bias, approximate):
        ctx.save_for_backward(x, bias)
        ctx.approximate = approximate
        out = torch.add(x, bias)
        return torch.ops.aten.gelu_(out, approximate=approximate)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        x, bias = ctx.saved_tensors
        grad_x = torch.add(x, bias)
        # elementwise, so the recomputed pre-activation can be overwritten by its own gradient
        torch.ops.aten.gelu_backward.grad_input(grad_out, grad_x, approximate=ctx.approximate, grad_input=grad_x)
        grad_bias = bias_grad(grad_x, bias.shape) if ctx.needs_input_grad[1] else None
        return grad_x, grad_bias, None


@compiled_on_first_use
def _bias_gelu_cuda(x, bias, approximate):
    return F.gelu(x + bias, approximate=approximate)
