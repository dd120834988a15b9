"""apex's ``fused_layer_norm_cuda`` extension, on torch's layer-norm kernels (:mod:`shim.ops.layer_norm`)."""

from shim.ops.layer_norm import (  # noqa: F401
    backward,
    backward_affine,
    forward,
    forward_affine,
    forward_affine_mixed_dtypes,
    rms_backward,
    rms_backward_affine,
    rms_forward,
    rms_forward_affine,
    rms_forward_affine_mixed_dtypes,
)

__all__ = ['backward', 'backward_affine', 'forward', 'forward_affine', 'forward_affine_mixed_dtypes', 'rms_backward', 'rms_backward_affine', 'rms_forward', 'rms_forward_affine', 'rms_forward_affine_mixed_dtypes']
