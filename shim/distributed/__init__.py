"""torch.distributed, plus: collectives that work in one process, a CPU-tolerant DDP, and the parallel layout.

- :mod:`shim.distributed.collectives`: ``all_reduce``, ``broadcast``, ``barrier``,
  ``get_rank``, ``new_group``... are torch's own with a process group, and
  world-of-one identities without one; ``init_process_group`` maps ``nccl`` to
  ``gloo`` without CUDA and needs no launcher for a world of one.
- :mod:`shim.distributed.buckets`: ``all_reduce_flat`` (many tensors, one collective per dtype).
- :mod:`shim.distributed.ddp`: ``DistributedDataParallel``; ``data_parallel(module)``
  (DDP or FSDP2 over the layout's ``dp`` dim).
- :mod:`shim.distributed.layout`: the parallel layout: ``setup_layout`` (four sizes ->
  DeviceMeshes), ``get_layout``, ``current_layout``, ``layer_mesh``; LiBai's names for them
  (``setup_dist_util``, ``get_layer_placement``...) are aliases kept for LiBai-era code.
- :mod:`shim.distributed.pipeline`: ``stage_layers``, ``pipeline_schedule``
  (torch.distributed.pipelining over the layout's ``pp`` dim).

Every other name is torch.distributed's own object. The pipeline module imports
torch.distributed.pipelining and DTensor (seconds), so its names load on first use.
"""

import torch.distributed as _torch_distributed

from shim._forward import forward_to as _forward_to
from shim.distributed.buckets import all_reduce_flat  # noqa: F401 (exported)
from shim.distributed.collectives import (  # noqa: F401 (exported)
    SingleProcessGroup,
    all_gather,
    all_gather_into_tensor,
    all_gather_object,
    all_reduce,
    all_to_all,
    all_to_all_single,
    barrier,
    broadcast,
    broadcast_object_list,
    destroy_process_group,
    gather,
    gather_object,
    get_rank,
    get_world_size,
    init_process_group,
    monitored_barrier,
    new_group,
    reduce,
    reduce_scatter,
    reduce_scatter_tensor,
    scatter,
    scatter_object_list,
)
from shim.distributed.ddp import DistributedDataParallel, data_parallel  # noqa: F401 (exported)
from shim.distributed.layout import (  # noqa: F401 (exported)
    ParallelLayout,
    current_layout,
    ensure_divisible,
    get_dist_util,
    get_hidden_sbp,
    get_layer_placement,
    get_layout,
    get_nd_sbp,
    holds_layer,
    is_main_process,
    layer_mesh,
    reset_dist_util,
    reset_layout,
    set_pipeline_num_layers,
    setup_dist_util,
    setup_layout,
    whole_layers,
)


def _pipeline():  # imports torch.distributed.pipelining: loaded on first use of these names
    from shim.distributed.pipeline import pipeline_schedule, stage_layers  # noqa: F401 (exported)

    return locals()


__getattr__, __dir__ = _forward_to(_torch_distributed, globals(), lazy=(_pipeline,))
