"""Megatron's model/data-parallel groups, read off the DeviceMesh that ``setup_layout`` builds.

"Model parallel" is the mesh's ``tp`` dim (adjacent ranks), "data parallel" its
``dp`` dim (ranks ``tp_size`` apart), exactly Megatron's grouping.
"""

from __future__ import annotations

import torch.distributed as _dist

from shim.distributed.layout import ParallelLayout, current_layout, reset_layout, setup_layout, world_size

__all__ = [
    "destroy_model_parallel",
    "get_data_parallel_group",
    "get_data_parallel_rank",
    "get_data_parallel_world_size",
    "get_model_parallel_group",
    "get_model_parallel_rank",
    "get_model_parallel_src_rank",
    "get_model_parallel_world_size",
    "initialize_model_parallel",
    "model_parallel_is_initialized",
]


def initialize_model_parallel(model_parallel_size_: int) -> None:
    """Split the world into tensor-parallel groups of ``model_parallel_size_`` adjacent ranks.

    As in Megatron, a size above the world size is capped to it. Initialises a
    world of one when no process group exists.
    """
    if current_layout() is not None:
        raise RuntimeError("model parallel is already initialized; call destroy_model_parallel() first")
    setup_layout(tensor_parallel_size=min(model_parallel_size_, world_size()))
    if _dist.get_rank() == 0:
        print(f"> initializing model parallel with size {get_model_parallel_world_size()}", flush=True)


def model_parallel_is_initialized() -> bool:
    return current_layout() is not None


def destroy_model_parallel() -> None:
    reset_layout()


def _layout() -> ParallelLayout:
    layout = current_layout()
    if layout is None:
        raise RuntimeError("model parallel is not initialized; call initialize_model_parallel() first")
    return layout


def get_model_parallel_group():
    return _layout().tensor_parallel_mesh.get_group()


def get_data_parallel_group():
    return _layout().data_parallel_mesh.get_group()


def get_model_parallel_world_size() -> int:
    return _layout().tensor_parallel_size


def get_model_parallel_rank() -> int:
    return _layout().tensor_parallel_rank


def get_model_parallel_src_rank() -> int:
    """The global rank of model-parallel rank 0 in this rank's group."""
    return int(_layout().tensor_parallel_mesh.mesh[0])


def get_data_parallel_world_size() -> int:
    return _layout().data_parallel_size


def get_data_parallel_rank() -> int:
    return _layout().data_parallel_rank
