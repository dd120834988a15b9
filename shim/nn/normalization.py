"""apex's ``FusedLayerNorm`` as ``torch.nn.LayerNorm``, whose CPU and CUDA kernels are fused already.

Same constructor as apex, same parameter names and state dict as ``torch.nn.LayerNorm`` (it is one).
``memory_efficient`` (apex: keep the output instead of the input for backward) is accepted and kept
as an attribute; torch's kernel decides what it saves. Half or bfloat16 inputs with fp32 weights,
apex's "mixed" case, are accepted by torch's kernels themselves (output in the input's dtype), so
``MixedFusedLayerNorm`` is the same class.
"""

from __future__ import annotations

import torch

from shim.ops import layer_norm

__all__ = [
    "FastLayerNorm", "FusedLayerNorm", "FusedLayerNormAffineFunction", "FusedRMSNorm", "MixedFusedLayerNorm",
    "MixedFusedRMSNorm", "fused_layer_norm", "fused_layer_norm_affine", "fused_rms_norm", "fused_rms_norm_affine",
    "mixed_dtype_fused_layer_norm_affine",
]


class FusedLayerNorm(torch.nn.LayerNorm):
    def __init__(
        self,
        normalized_shape,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        memory_efficient: bool = False,
        *,
        device=None,
        dtype=None,
    ):
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine, device=device, dtype=dtype)
        self.memory_efficient = memory_efficient

    def extra_repr(self) -> str:
        return super().extra_repr() + (", memory_efficient=True" if self.memory_efficient else "")


MixedFusedLayerNorm = FusedLayerNorm


class FusedRMSNorm(torch.nn.RMSNorm):
    """apex's ``FusedRMSNorm(normalized_shape, eps=1e-5, elementwise_affine=True, memory_efficient=False)``
    as ``torch.nn.RMSNorm`` (``weight`` only, as apex)."""

    def __init__(self, normalized_shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 memory_efficient: bool = False, *, device=None, dtype=None):
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine, device=device, dtype=dtype)
        self.memory_efficient = memory_efficient


MixedFusedRMSNorm = FusedRMSNorm


class FastLayerNorm(torch.nn.LayerNorm):
    """apex.contrib's ``FastLayerNorm(hidden_size, eps=1e-5)``: affine layer norm over the last dim."""

    def __init__(self, hidden_size, eps: float = 1e-5):
        super().__init__(hidden_size, eps=eps)


class FusedLayerNormAffineFunction(torch.autograd.Function):
    """apex's / Megatron's ``FusedLayerNormAffineFunction.apply(input, weight, bias, normalized_shape, eps)``
    on :mod:`shim.ops.layer_norm` (output in the input's dtype; mean and invvar kept in fp32)."""

    @staticmethod
    def forward(ctx, input, weight, bias, normalized_shape, eps, *memory_efficient):
        ctx.normalized_shape, ctx.eps = normalized_shape, eps
        input_, weight_, bias_ = input.contiguous(), weight.contiguous(), bias.contiguous()
        output, mean, invvar = layer_norm.forward_affine(input_, normalized_shape, weight_, bias_, eps)
        ctx.save_for_backward(input_, weight_, bias_, mean, invvar)
        return output

    @staticmethod
    def backward(ctx, grad_output):
        input_, weight_, bias_, mean, invvar = ctx.saved_tensors
        grads = layer_norm.backward_affine(grad_output.contiguous(), mean, invvar, input_, ctx.normalized_shape,
                                           weight_, bias_, ctx.eps)
        return (*grads, *[None] * (len(ctx.needs_input_grad) - 3))  # none for shape, eps (, memory_efficient)


def fused_layer_norm_affine(input, weight, bias, normalized_shape, eps=1e-6, memory_efficient=False):
    return torch.nn.functional.layer_norm(input, list(normalized_shape), weight, bias, eps)


def fused_layer_norm(input, normalized_shape, eps=1e-6, memory_efficient=False):
    return torch.nn.functional.layer_norm(input, list(normalized_shape), None, None, eps)


def mixed_dtype_fused_layer_norm_affine(input, weight, bias, normalized_shape, eps=1e-6, memory_efficient=False):
    return torch.nn.functional.layer_norm(input.to(weight.dtype), list(normalized_shape), weight, bias, eps)


def fused_rms_norm_affine(input, weight, normalized_shape, eps=1e-6, memory_efficient=False):
    return torch.nn.functional.rms_norm(input, list(normalized_shape), weight, eps)


def fused_rms_norm(input, normalized_shape, eps=1e-6, memory_efficient=False):
    return torch.nn.functional.rms_norm(input, list(normalized_shape), None, eps)
