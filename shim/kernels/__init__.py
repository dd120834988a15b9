"""Stand-ins for compiled CUDA extensions, one module per extension, named as code imports them.

GLM-era trees import apex's and Megatron's CUDA builds by their bare module names (``import amp_C``,
``import scaled_masked_softmax_cuda``, ``importlib.import_module("fused_mix_prec_layer_norm_cuda")``).
The rule tables map each name onto the module here of the same name, which keeps the extension's
functions and argument order and computes with ``shim.ops`` (torch kernels, any device):

- ``amp_C``: apex's multi-tensor kernels (:mod:`shim.ops.multi_tensor`);
- ``fused_layer_norm_cuda`` (apex), ``fused_mix_prec_layer_norm_cuda`` (Megatron): :mod:`shim.ops.layer_norm`;
- ``scaled_masked_softmax_cuda``, ``scaled_upper_triang_masked_softmax_cuda``, ``scaled_softmax_cuda``
  (Megatron's fused softmax): :mod:`shim.ops.softmax`;
- ``megatron_fused_kernels``: Megatron's ``fused_kernels.load(args)``, which builds the above with
  nvcc at start-up; here there is nothing to build.
"""

from shim._forward import submodules_on_first_use as _submodules_on_first_use

__all__ = ['amp_C', 'fused_layer_norm_cuda', 'fused_mix_prec_layer_norm_cuda', 'megatron_fused_kernels', 'scaled_masked_softmax_cuda', 'scaled_softmax_cuda', 'scaled_upper_triang_masked_softmax_cuda']


# Submodules load on first use (``shim.kernels.amp_C`` as an attribute, the way migrated code spells it).
__getattr__ = _submodules_on_first_use(__name__)
