"""The parallel layout: how the ranks split into data, tensor and pipeline parallel groups.

One name for one concept: a *layout* (:class:`ParallelLayout`) is the arrangement of the
ranks; its *meshes* are torch ``DeviceMesh``es. ``setup_layout(data_parallel_size=,
tensor_parallel_size=, pipeline_parallel_size=, pipeline_num_layers=)`` arranges the ranks
as a grid ``[pp][dp][tp]`` (tensor-parallel neighbours have adjacent ranks, as in Megatron)
and builds:

- the root mesh, dims ``("pp", "dp", "tp")``;
- one mesh per pipeline stage, dims ``("dp", "tp")``: ``layer_mesh(layer_idx)``, the mesh
  a layer's weights are DTensors on; ``holds_layer(layer_idx)``: whether this rank's stage
  holds the layer (a model builds the others on the meta device).

The layer count the stages split is ``pipeline_num_layers``; a loader that learns the model's
count after the layout exists sets it with ``set_pipeline_num_layers``.

Every size is checked against the world size before any collective starts.

LiBai calls the layout ``dist_util`` and a layer's mesh its *placement*; its names
(``setup_dist_util``, ``get_dist_util``, ``get_layer_placement``, ``get_nd_sbp``,
``get_hidden_sbp``) are at the end of this module, as aliases for LiBai-era code.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch.distributed as _dist

from shim._device import active_device
from shim.distributed.collectives import init_process_group

__all__ = [
    "ParallelLayout",
    "current_layout",
    "ensure_divisible",
    "get_layout",
    "holds_layer",
    "is_main_process",
    "layer_mesh",
    "reset_layout",
    "set_pipeline_num_layers",
    "setup_layout",
    "whole_layers",
    "world_size",
    # LiBai's names
    "get_dist_util",
    "get_hidden_sbp",
    "get_layer_placement",
    "get_nd_sbp",
    "reset_dist_util",
    "setup_dist_util",
]

if TYPE_CHECKING:  # DeviceMesh and DTensor take seconds to import: loaded when a layout is built
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import Placement

_layout: ParallelLayout | None = None


def ensure_divisible(value: int, parts: int, what: str, by: str) -> int:
    """``value // parts``, or a one-line error naming both quantities."""
    if parts <= 0 or value % parts:
        raise ValueError(f"{what} ({value}) is not divisible by {by} ({parts})")
    return value // parts


@dataclass
class ParallelLayout:
    """The four sizes, the meshes built for them, and this rank's coordinates in them."""

    data_parallel_size: int
    tensor_parallel_size: int
    pipeline_parallel_size: int
    pipeline_num_layers: int
    device_type: str
    mesh: DeviceMesh  # dims ("pp", "dp", "tp")
    stage_meshes: list[DeviceMesh] = field(repr=False)  # per stage, dims ("dp", "tp")

    @property
    def pipeline_stage(self) -> int:
        return self.mesh.get_local_rank("pp")

    @property
    def data_parallel_rank(self) -> int:
        return self.mesh.get_local_rank("dp")

    @property
    def tensor_parallel_rank(self) -> int:
        return self.mesh.get_local_rank("tp")

    @property
    def tensor_parallel_mesh(self) -> DeviceMesh:
        return self.mesh["tp"]

    @property
    def data_parallel_mesh(self) -> DeviceMesh:
        return self.mesh["dp"]

    @property
    def pipeline_mesh(self) -> DeviceMesh:
        return self.mesh["pp"]

    def layer_stage(self, layer_idx: int) -> int:
        """The pipeline stage holding layer ``layer_idx`` (negative counts from the end).

        Layers split evenly; when they do not divide, the last stages take one more. With one stage
        every layer is on it, whatever its index.
        """
        n, p = self.pipeline_num_layers, self.pipeline_parallel_size
        if p == 1:
            return 0
        if layer_idx < 0:
            layer_idx += n
        if not 0 <= layer_idx < n:
            raise IndexError(f"layer_idx {layer_idx} is outside the pipeline's {n} layers")
        per_stage, extra = divmod(n, p)
        first_long_layer = (p - extra) * per_stage  # stages before it hold per_stage layers
        if layer_idx < first_long_layer:
            return layer_idx // per_stage
        return p - extra + (layer_idx - first_long_layer) // (per_stage + 1)

    def stage_layers(self, stage: int) -> range:
        """The layer indices pipeline stage ``stage`` holds (the inverse of ``layer_stage``)."""
        if not 0 <= stage < self.pipeline_parallel_size:
            raise IndexError(f"stage {stage} is outside the pipeline's {self.pipeline_parallel_size} stages")
        per_stage, extra = divmod(self.pipeline_num_layers, self.pipeline_parallel_size)
        short_stages = self.pipeline_parallel_size - extra
        if stage < short_stages:
            return range(stage * per_stage, (stage + 1) * per_stage)
        start = short_stages * per_stage + (stage - short_stages) * (per_stage + 1)
        return range(start, start + per_stage + 1)


def _resolve_sizes(world, data_parallel_size, tensor_parallel_size, pipeline_parallel_size, pipeline_num_layers):
    sizes = {
        "tensor_parallel_size": 1 if tensor_parallel_size is None else tensor_parallel_size,
        "pipeline_parallel_size": 1 if pipeline_parallel_size is None else pipeline_parallel_size,
        "data_parallel_size": data_parallel_size,
    }
    for name, size in sizes.items():
        if size is not None and size < 1:
            raise ValueError(f"{name} must be at least 1, got {size}")
    tp, pp = sizes["tensor_parallel_size"], sizes["pipeline_parallel_size"]
    if data_parallel_size is None:
        dp = ensure_divisible(world, tp * pp, "world size", "tensor_parallel_size * pipeline_parallel_size")
    else:
        dp = data_parallel_size
    if dp * tp * pp != world:
        raise ValueError(
            f"data_parallel_size * tensor_parallel_size * pipeline_parallel_size = {dp} * {tp} * {pp} "
            f"= {dp * tp * pp} does not equal the world size ({world})"
        )
    layers = pipeline_num_layers if pipeline_num_layers is not None else pp
    if layers < pp:
        raise ValueError(f"pipeline_num_layers ({layers}) is smaller than pipeline_parallel_size ({pp})")
    return dp, tp, pp, layers


def world_size() -> int:
    """The world size: the process group's, or ``WORLD_SIZE``'s before one exists."""
    return _dist.get_world_size() if _dist.is_initialized() else int(os.environ.get("WORLD_SIZE", "1"))


def setup_layout(
    data_parallel_size: int | None = None,
    tensor_parallel_size: int | None = None,
    pipeline_parallel_size: int | None = None,
    pipeline_num_layers: int | None = None,
) -> ParallelLayout:
    """Build the meshes for LiBai's four numbers; initialise the process group if needed.

    Unset sizes default to 1 for tensor and pipeline parallel and to the rest of
    the world for data parallel. ``pipeline_num_layers`` defaults to the number
    of stages. In one process with no launcher this sets up a world of one.
    """
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    global _layout
    dp, tp, pp, layers = _resolve_sizes(
        world_size(), data_parallel_size, tensor_parallel_size, pipeline_parallel_size, pipeline_num_layers
    )
    device_type = active_device().type
    if not _dist.is_initialized():
        init_process_group("nccl" if device_type == "cuda" else "gloo")
    mesh = init_device_mesh(device_type, (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
    stage_meshes = [mesh["dp", "tp"]]
    if pp > 1:
        # Other stages' meshes: every rank builds every one, in the same order (making
        # groups is collective). This rank's own stage stays a slice of the root mesh,
        # so its tensor-parallel DTensors compose with FSDP on the same root.
        stage_meshes = [DeviceMesh(device_type, mesh.mesh[stage], mesh_dim_names=("dp", "tp")) for stage in range(pp)]
        stage_meshes[mesh.get_local_rank("pp")] = mesh["dp", "tp"]
    _layout = ParallelLayout(dp, tp, pp, layers, device_type, mesh, stage_meshes)
    return _layout


def current_layout() -> ParallelLayout | None:
    """The layout ``setup_layout`` built, or None before it runs."""
    return _layout


def get_layout() -> ParallelLayout:
    """The layout, set up with defaults (all data parallel) if nobody did so yet."""
    return _layout if _layout is not None else setup_layout()


def reset_layout() -> None:
    """Forget the layout (the process group stays)."""
    global _layout
    _layout = None


@contextlib.contextmanager
def whole_layers():
    """Modules built inside are whole (unsplit), as in one process, though a layout is set; the layout is back
    after. For a rank that needs a model's full tensors, e.g. to copy its own slices out of them."""
    global _layout
    saved, _layout = _layout, None
    try:
        yield
    finally:
        _layout = saved


def set_pipeline_num_layers(num_layers: int) -> ParallelLayout:
    """Tell the layout how many layers its pipeline stages split (a model's, known after the layout)."""
    layout = get_layout()
    if num_layers < layout.pipeline_parallel_size:
        raise ValueError(f"{num_layers} layers do not fill {layout.pipeline_parallel_size} pipeline stages")
    layout.pipeline_num_layers = num_layers
    return layout


def holds_layer(layer_idx: int) -> bool:
    """Whether this rank's pipeline stage holds layer ``layer_idx`` (always, without a layout or pipeline)."""
    layout = current_layout()
    if layout is None or layout.pipeline_parallel_size == 1:
        return True
    return layout.layer_stage(layer_idx) == layout.pipeline_stage


def layer_mesh(layer_idx: int = 0) -> DeviceMesh:
    """The ``("dp", "tp")`` mesh of the pipeline stage that holds layer ``layer_idx``."""
    layout = get_layout()
    return layout.stage_meshes[layout.layer_stage(layer_idx)]


def is_main_process() -> bool:
    return not _dist.is_initialized() or _dist.get_rank() == 0


# --- LiBai's names (libai.utils.distributed) ------------------------------------------------
# The same functions under the names LiBai-era code calls; new code uses the names above.
setup_dist_util = setup_layout
get_dist_util = get_layout
reset_dist_util = reset_layout
get_layer_placement = layer_mesh


def get_nd_sbp(sbp_list) -> tuple[Placement, ...]:
    """The placements for a tensor on a layer's mesh, given as ``[sbp over dp, sbp over tp]``."""
    from torch.distributed.tensor import Placement

    sbp = tuple(sbp_list)
    if len(sbp) != 2 or not all(isinstance(s, Placement) for s in sbp):
        raise ValueError(f"get_nd_sbp expects [sbp over dp, sbp over tp], got {sbp_list!r}")
    return sbp


def get_hidden_sbp() -> tuple[Placement, ...]:
    """Hidden states: batch split over data parallel, whole on every tensor-parallel rank."""
    from torch.distributed.tensor import Replicate, Shard

    return get_nd_sbp([Shard(0), Replicate()])
