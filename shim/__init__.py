"""shim: all of torch, plus what GLM-era code needs. Use it as ``import shim as torch``.

Any attribute torch has resolves to torch's own object (``shim.Tensor is
torch.Tensor``). shim adds, in one place per concern:

- ``shim.nn`` / ``shim.nn.functional``: apex-compatible layers, fused ops
  (``sparse_softmax_cross_entropy``, ``fused_bias_add_gelu``,
  ``fused_bias_add_dropout``), tensor-parallel layers (kernels live in ``shim.ops``);
- ``shim.optim``: apex / DeepSpeed optimizer fallbacks;
- ``shim.kernels``: compiled CUDA extensions by their import names (``amp_C``,
  ``scaled_masked_softmax_cuda``...) on ``shim.ops``; ``shim.apex.multi_tensor_apply``;
- ``shim.cuda`` and ``shim.device()``: CUDA-era calls that also run without CUDA;
- ``shim.compat``: the same portability applied to torch itself (for the mock);
- ``shim.distributed``, ``shim.mpu``, ``shim.checkpointing``: collectives that
  work in one process, the Megatron ``mpu`` surface and activation
  checkpointing on a DeviceMesh;
- ``shim.sbp``, ``shim.placement``, ``shim.to_global``, ``shim.to_local``:
  OneFlow-style global tensors on DTensor.

Importing shim changes nothing in torch.
"""

import importlib as _importlib

import torch as _torch

from shim._forward import forward_to as _forward_to, install_alias_finder as _install_alias_finder

_install_alias_finder()

# shim's own submodules shadow torch's of the same name; imported on first use.
_OWN_SUBMODULES = frozenset(
    {"nn", "optim", "cuda", "compat", "distributed", "mpu", "checkpointing", "ops", "sbp", "deepspeed", "kernels", "apex"}
)
# Names shim defines on top of torch, and the module each lives in.
_OWN_NAMES = {
    "device": "shim._device",
    "placement": "shim.global_tensor",
    "to_global": "shim.global_tensor",
    "to_local": "shim.global_tensor",
}

_torch_getattr, _torch_dir = _forward_to(_torch, globals())


def __getattr__(name):
    if name in _OWN_SUBMODULES:
        return _importlib.import_module(f"shim.{name}")
    if name in _OWN_NAMES:
        value = getattr(_importlib.import_module(_OWN_NAMES[name]), name)
        globals()[name] = value
        return value
    return _torch_getattr(name)


def __dir__():
    return sorted(set(_torch_dir()) | _OWN_SUBMODULES | set(_OWN_NAMES))
