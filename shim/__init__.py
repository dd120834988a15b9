"""shim: all of torch, plus what GLM-era code needs. Use it as ``import shim as torch``.

Any attribute torch has resolves to torch's own object (``shim.Tensor is torch.Tensor``).
shim's own modules come in layers, each importing only the ones before it
(``tests/test_architecture.py``):

1. ``shim.ops``: the fused kernels (torch only).
2. Torch-shaped modules, torch's namespace plus additions that have a torch counterpart:
   ``shim.nn`` / ``shim.nn.functional`` (apex's FusedLayerNorm, tensor-parallel layers, the
   fused ops), ``shim.optim`` (apex / DeepSpeed optimizers), ``shim.cuda`` and
   ``shim.device()`` (CUDA-era calls without CUDA), ``shim.distributed`` (collectives in one
   process, DDP, the parallel layout, pipelining), ``shim.compat`` (the same portability
   applied to torch itself, for the mock).
3. Upstream surfaces with no torch counterpart, one module each: ``shim.recompute``
   (activation recompute; ``shim.checkpointing`` is DeepSpeed's name for it),
   ``shim.deepspeed``, ``shim.mpu`` (Megatron), ``shim.global_tensor`` + ``shim.sbp``
   (OneFlow's global tensors, also as ``shim.placement`` / ``shim.to_global`` / ``shim.to_local``).

Where an upstream name lives:

- apex: ``FusedAdam`` / ``FusedSGD`` in ``shim.optim`` (:mod:`shim.optim.fused`);
  ``FusedLayerNorm`` / ``MixedFusedLayerNorm`` in ``shim.nn`` (:mod:`shim.nn.normalization`);
  ``parallel.DistributedDataParallel`` in ``shim.distributed`` (:mod:`shim.distributed.ddp`);
  ``multi_tensor_applier`` in :mod:`shim.apex.multi_tensor_apply`, ``amp_C`` is :mod:`shim.kernels.amp_C`;
  ``FusedRMSNorm``, ``FastLayerNorm``, ``FusedDense``, ``FusedScaleMaskSoftmax`` in ``shim.nn``.
- Megatron's CUDA extensions (``scaled_masked_softmax_cuda``...) and ``fused_kernels.load``: :mod:`shim.kernels`.
- DeepSpeed: :mod:`shim.deepspeed` (``init_distributed``, its flags); ``deepspeed.checkpointing``
  is :mod:`shim.checkpointing` (= :mod:`shim.recompute`); ``DeepSpeedCPUAdam`` in ``shim.optim``.
- Megatron: ``mpu`` is :mod:`shim.mpu`.
- OneFlow: ``placement`` / ``to_global`` / ``to_local`` in :mod:`shim.global_tensor`; ``sbp`` is :mod:`shim.sbp`.
- LiBai: the layout is :mod:`shim.distributed.layout` (``setup_layout``; LiBai's ``setup_dist_util``,
  ``get_layer_placement`` are aliases there); ``Linear1D`` / ``VocabParallelEmbedding`` in ``shim.nn``
  (:mod:`shim.nn.tensor_parallel`).

``rules/*.toml`` map each upstream name to its shim name. Importing shim changes nothing in torch.
"""

import importlib as _importlib
import pkgutil as _pkgutil

import torch as _torch

from shim._device import device  # noqa: F401 (exported)
from shim._forward import (
    forward_to as _forward_to,
    install_alias_finder as _install_alias_finder,
    lazy_loaders as _lazy_loaders,
)

_install_alias_finder()


def _global_tensor():  # imports DTensor: loaded on first use of these names
    from shim.global_tensor import placement, to_global, to_local  # noqa: F401 (exported)

    return locals()


# Every public submodule of shim (shim.nn, shim.mpu...) shadows torch's of the same name, if any,
# and is imported on first use: `import shim` stays as cheap as `import torch`.
_SUBMODULES = frozenset(m.name for m in _pkgutil.iter_modules(__path__) if not m.name.startswith("_"))
# OneFlow's top-level names; like the submodules, not part of `from shim import *` (torch's names).
_LAZY = _lazy_loaders(_global_tensor)

_torch_getattr, _torch_dir = _forward_to(_torch, globals())


def __getattr__(name):
    if name in _SUBMODULES:
        return _importlib.import_module(f"shim.{name}")
    if name in _LAZY:
        globals().update(_LAZY[name]())
        return globals()[name]
    return _torch_getattr(name)


def __dir__():
    return sorted(set(_torch_dir()) | _SUBMODULES | set(_LAZY))
