"""Data parallel: ``DistributedDataParallel`` that also wraps a model in one process or on CPU,
and ``data_parallel()`` over the layout's ``dp`` dim."""

from __future__ import annotations

import contextlib
import sys

import torch
from torch.nn.parallel import DistributedDataParallel as _TorchDDP

from shim.distributed.collectives import get_world_size

__all__ = ["DistributedDataParallel", "data_parallel"]


class _EitherDDP(type(torch.nn.Module)):
    # ``isinstance(model, shim.distributed.DistributedDataParallel)`` holds for
    # both forms the constructor may return, so unwrapping loops keep working.
    def __instancecheck__(cls, instance) -> bool:
        return type.__instancecheck__(cls, instance) or isinstance(instance, _TorchDDP)


class DistributedDataParallel(torch.nn.Module, metaclass=_EitherDDP):
    """``torch.nn.parallel.DistributedDataParallel`` where data parallelism exists, a plain wrapper where not.

    With a process group of more than one rank this returns torch's own DDP;
    ``device_ids`` / ``output_device`` are dropped for CPU modules, which torch
    rejects them for. With one rank (or no process group) there is nothing to
    synchronise: the result just holds the model as ``.module`` and calls it, so
    checkpoints keep their ``module.`` prefix either way.
    """

    def __new__(cls, module=None, device_ids=None, output_device=None, process_group=None, **kwargs):
        # module is None when copy/pickle re-creates an instance: always the plain wrapper then.
        if module is not None and get_world_size(group=process_group) > 1:
            if _has_dtensor_parameters(module):
                raise TypeError(
                    "DistributedDataParallel: the model has tensor-parallel (DTensor) parameters, which torch DDP "
                    "cannot bucket; use shim.distributed.data_parallel(model) (FSDP2 on the dp mesh)"
                )
            if not _on_accelerator(module):
                device_ids = output_device = None
            return _TorchDDP(
                module, device_ids=device_ids, output_device=output_device, process_group=process_group, **kwargs
            )
        return super().__new__(cls)

    def __init__(self, module, device_ids=None, output_device=None, process_group=None, **kwargs):
        super().__init__()
        self.module = module

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """No gradients to synchronise in one process."""
        yield


def _has_dtensor_parameters(module: torch.nn.Module) -> bool:
    # No DTensor can exist before torch.distributed.tensor is imported; don't import it here.
    dtensor_module = sys.modules.get("torch.distributed.tensor")
    return dtensor_module is not None and any(isinstance(p, dtensor_module.DTensor) for p in module.parameters())


def _on_accelerator(module: torch.nn.Module) -> bool:
    return any(p.device.type not in ("cpu", "meta") for p in module.parameters())


def data_parallel(module: torch.nn.Module, *, shard: bool = False) -> torch.nn.Module:
    """Make ``module`` data parallel over the layout's ``dp`` dim, with PyTorch's own engines.

    - ``shard=False`` and no DTensor parameters: torch DDP on the ``dp`` group
      (gradients averaged; ``.module`` is the model).
    - ``shard=True``, or tensor-parallel (DTensor) parameters, which DDP cannot
      take: FSDP2 ``fully_shard`` on the ``dp`` mesh (parameters and gradients
      sharded over ``dp``, averaged; the module itself is returned, sharded).

    With a data-parallel size of 1 the module is returned unchanged.
    """
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from shim.distributed.layout import get_layout

    layout = get_layout()
    if layout.data_parallel_size == 1:
        return module
    if shard or any(isinstance(p, DTensor) for p in module.parameters()):
        return fully_shard(module, mesh=layout.data_parallel_mesh)
    return _TorchDDP(module, process_group=layout.data_parallel_mesh.get_group())
