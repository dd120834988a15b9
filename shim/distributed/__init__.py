"""torch.distributed, plus: collectives that work in one process, a CPU-tolerant DDP, and the parallel layout.

- :mod:`shim.distributed.collectives`: ``all_reduce``, ``broadcast``, ``barrier``,
  ``get_rank``, ``new_group``... are torch's own with a process group, and
  world-of-one identities without one; ``init_process_group`` maps ``nccl`` to
  ``gloo`` without CUDA and needs no launcher for a world of one.
- :mod:`shim.distributed.ddp`: ``DistributedDataParallel``; ``data_parallel(module)``
  (DDP or FSDP2 over the layout's ``dp`` dim).
- :mod:`shim.distributed.layout`: ``setup_dist_util`` (LiBai's four numbers -> DeviceMeshes),
  ``get_layer_placement``, ``get_nd_sbp``, ``get_hidden_sbp``, ``is_main_process``.
- :mod:`shim.distributed.pipeline`: ``stage_layers``, ``pipeline_schedule``
  (torch.distributed.pipelining over the layout's ``pp`` dim).

Every other name is torch.distributed's own object.
"""

import torch.distributed as _torch_distributed

from shim._forward import forward_to as _forward_to

_COLLECTIVES = (
    "SingleProcessGroup all_gather all_gather_into_tensor all_gather_object all_reduce all_to_all "
    "all_to_all_single barrier broadcast broadcast_object_list destroy_process_group gather gather_object get_rank "
    "get_world_size init_process_group monitored_barrier new_group reduce reduce_scatter "
    "reduce_scatter_tensor scatter scatter_object_list"
).split()

_LAYOUT = (
    "ParallelLayout current_layout ensure_divisible get_dist_util get_hidden_sbp get_layer_placement "
    "get_nd_sbp is_main_process reset_dist_util setup_dist_util"
).split()

# name -> module that defines it (imported on first use)
_OWN = {
    **{name: "shim.distributed.collectives" for name in _COLLECTIVES},
    "DistributedDataParallel": "shim.distributed.ddp",
    "data_parallel": "shim.distributed.ddp",
    "pipeline_schedule": "shim.distributed.pipeline",
    "stage_layers": "shim.distributed.pipeline",
    **{name: "shim.distributed.layout" for name in _LAYOUT},
}

__getattr__, __dir__ = _forward_to(_torch_distributed, globals(), own=_OWN)
