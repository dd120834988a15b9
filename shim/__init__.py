"""shim: all of torch, plus what GLM-era code needs. Use it as ``import shim as torch``.

Any attribute torch has resolves to torch's own object (``shim.Tensor is
torch.Tensor``). shim adds, in one place per concern:

- ``shim.nn`` / ``shim.nn.functional``: apex-compatible layers, fused ops
  (``sparse_softmax_cross_entropy``, ``fused_bias_add_gelu``,
  ``fused_bias_add_dropout``), tensor-parallel layers (kernels live in ``shim.ops``);
- ``shim.optim``: apex / DeepSpeed optimizer fallbacks;
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
import pkgutil as _pkgutil

import torch as _torch

from shim._device import device
from shim._forward import forward_to as _forward_to, install_alias_finder as _install_alias_finder

_install_alias_finder()


def _global_tensor():  # imports DTensor: loaded on first use of these names
    from shim.global_tensor import placement, to_global, to_local

    return locals()


# Every public submodule of shim (shim.nn, shim.mpu...) shadows torch's of the same name, if any,
# and is imported on first use: `import shim` stays as cheap as `import torch`.
_SUBMODULES = frozenset(m.name for m in _pkgutil.iter_modules(__path__) if not m.name.startswith("_"))

_torch_getattr, _torch_dir = _forward_to(_torch, globals(), lazy=(_global_tensor,))


def __getattr__(name):
    if name in _SUBMODULES:
        return _importlib.import_module(f"shim.{name}")
    return _torch_getattr(name)


def __dir__():
    return sorted(set(_torch_dir()) | _SUBMODULES)
