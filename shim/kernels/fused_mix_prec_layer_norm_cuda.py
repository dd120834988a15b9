"""Megatron's ``fused_mix_prec_layer_norm_cuda`` extension: apex's layer norm whose output takes the
weight's dtype (fp16 activations, fp32 weights: fp32 out), on :mod:`shim.ops.layer_norm`."""

from shim.ops.layer_norm import backward_affine  # noqa: F401
from shim.ops.layer_norm import forward_affine_mixed_dtypes as forward_affine  # noqa: F401

__all__ = ['backward_affine', 'forward_affine']
