"""The layer-norm kernels behind apex's ``fused_layer_norm_cuda`` and Megatron's
``fused_mix_prec_layer_norm_cuda``, on torch's own (fused) ``native_layer_norm`` kernels.

The kernels' API, which these keep: ``forward_affine(input, normalized_shape, weight, bias, eps)``
returns ``(output, mean, invvar)`` with ``mean`` / ``invvar`` (1/sqrt(var + eps)) as fp32 vectors of
one value per normalized row; ``backward_affine(grad_output, mean, invvar, input, normalized_shape,
weight, bias, eps)`` returns ``(grad_input, grad_weight, grad_bias)``. Statistics are fp32 whatever
the input dtype. The output dtype is where the two differ: apex's kernel returns the input's dtype,
Megatron's "mixed precision" one (and apex's ``*_mixed_dtypes``) the weight's, so an fp16 input with
fp32 weights gives an fp32 output.
"""

from __future__ import annotations

import math

import torch

__all__ = ['forward_affine', 'forward_affine_mixed_dtypes', 'forward', 'backward_affine', 'backward', 'rms_forward_affine', 'rms_forward_affine_mixed_dtypes', 'rms_forward', 'rms_backward_affine', 'rms_backward']


def _rows(input: torch.Tensor, normalized_shape) -> int:
    return input.numel() // max(math.prod(normalized_shape), 1)


def _forward(input, normalized_shape, weight, bias, eps, out_dtype):
    normalized_shape = list(normalized_shape)
    compute = torch.float32 if (weight is not None and weight.dtype != input.dtype) or input.dtype in (
        torch.float16, torch.bfloat16) else input.dtype
    x = input.to(compute)
    w = weight.to(compute) if weight is not None else None
    b = bias.to(compute) if bias is not None else None
    out, mean, rstd = torch.native_layer_norm(x, normalized_shape, w, b, float(eps))
    rows = _rows(input, normalized_shape)
    return out.to(out_dtype), mean.reshape(rows).float(), rstd.reshape(rows).float()


def _backward(grad_output, mean, invvar, input, normalized_shape, weight, bias, memory_efficient=False):
    normalized_shape = list(normalized_shape)
    stats_shape = input.shape[: input.dim() - len(normalized_shape)] + (1,) * len(normalized_shape)
    if memory_efficient:  # apex saved the output instead of the input: x = (y - b) / w / invvar + mean
        y = input.float()
        if bias is not None:
            y = y - bias.float()
        if weight is not None:
            y = y / weight.float()
        input = (y / invvar.float().reshape(stats_shape) + mean.float().reshape(stats_shape)).to(input.dtype)
    compute = torch.float32 if (weight is not None and weight.dtype != input.dtype) or input.dtype in (
        torch.float16, torch.bfloat16) else input.dtype
    w = weight.to(compute) if weight is not None else None
    b = bias.to(compute) if bias is not None else None
    mask = [True, weight is not None, bias is not None]
    grad_input, grad_weight, grad_bias = torch.ops.aten.native_layer_norm_backward(
        grad_output.to(compute), input.to(compute), normalized_shape,
        mean.to(compute).reshape(stats_shape), invvar.to(compute).reshape(stats_shape), w, b, mask)
    return (
        grad_input.to(input.dtype),
        grad_weight.to(weight.dtype) if weight is not None else None,
        grad_bias.to(bias.dtype) if bias is not None else None,
    )


def forward_affine(input, normalized_shape, weight, bias, eps):
    """apex ``fused_layer_norm_cuda.forward_affine``: output in the input's dtype."""
    return _forward(input, normalized_shape, weight, bias, eps, input.dtype)


def forward_affine_mixed_dtypes(input, normalized_shape, weight, bias, eps):
    """apex's and Megatron's mixed-precision forward: output in the weight's dtype."""
    return _forward(input, normalized_shape, weight, bias, eps, weight.dtype)


def forward(input, normalized_shape, eps):
    """apex ``fused_layer_norm_cuda.forward`` (no affine): ``(output, mean, invvar)``."""
    return _forward(input, normalized_shape, None, None, eps, input.dtype)


def backward_affine(grad_output, mean, invvar, input, normalized_shape, weight, bias, eps, memory_efficient=False):
    """``(grad_input, grad_weight, grad_bias)``, each in its tensor's dtype. With apex's newer
    ``memory_efficient=True``, ``input`` is the forward's output (the input is rebuilt from it)."""
    return _backward(grad_output, mean, invvar, input, normalized_shape, weight, bias, memory_efficient)


def backward(grad_output, mean, invvar, input, normalized_shape, eps, memory_efficient=False):
    """apex ``fused_layer_norm_cuda.backward`` (no affine): ``grad_input``."""
    return _backward(grad_output, mean, invvar, input, normalized_shape, None, None, memory_efficient)[0]


def _rms(input, normalized_shape, weight, eps):
    dims = tuple(range(input.dim() - len(normalized_shape), input.dim()))
    x = input.float()
    invvar = torch.rsqrt(x.square().mean(dim=dims, keepdim=True) + float(eps))
    out = x * invvar
    if weight is not None:
        out = out * weight.float()
    return out, invvar


def rms_forward_affine(input, normalized_shape, weight, eps):
    """apex ``rms_forward_affine``: ``(x * rsqrt(mean(x**2) + eps) * weight, invvar)``, input's dtype."""
    out, invvar = _rms(input, list(normalized_shape), weight, eps)
    return out.to(input.dtype), invvar.reshape(_rows(input, normalized_shape))


def rms_forward_affine_mixed_dtypes(input, normalized_shape, weight, eps):
    out, invvar = _rms(input, list(normalized_shape), weight, eps)
    return out.to(weight.dtype), invvar.reshape(_rows(input, normalized_shape))


def rms_forward(input, normalized_shape, eps):
    out, invvar = _rms(input, list(normalized_shape), None, eps)
    return out.to(input.dtype), invvar.reshape(_rows(input, normalized_shape))


def _rms_grads(grad_output, input, normalized_shape, weight, eps):
    with torch.enable_grad():
        x = input.detach().float().requires_grad_()
        w = weight.detach().float().requires_grad_() if weight is not None else None
        out, _ = _rms(x, list(normalized_shape), w, eps)
        wanted = [x] + ([w] if w is not None else [])
        grads = torch.autograd.grad(out, wanted, grad_output.float())
    return grads[0].to(input.dtype), (grads[1].to(weight.dtype) if weight is not None else None)


def rms_backward_affine(grad_output, invvar, input, normalized_shape, weight, eps, memory_efficient=False):
    """``(grad_input, grad_weight)`` of :func:`rms_forward_affine` (recomputed from the input)."""
    if memory_efficient:
        stats = input.shape[: input.dim() - len(normalized_shape)] + (1,) * len(normalized_shape)
        input = (input.float() / weight.float() / invvar.float().reshape(stats)).to(input.dtype)
    return _rms_grads(grad_output, input, normalized_shape, weight, eps)


def rms_backward(grad_output, invvar, input, normalized_shape, eps, memory_efficient=False):
    if memory_efficient:
        stats = input.shape[: input.dim() - len(normalized_shape)] + (1,) * len(normalized_shape)
        input = (input.float() / invvar.float().reshape(stats)).to(input.dtype)
    return _rms_grads(grad_output, input, normalized_shape, None, eps)[0]
