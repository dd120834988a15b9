"""Megatron's four region functions, as DTensor placement changes on the model-parallel mesh.

==================================  ======================  ==========================
function                            forward                 backward
==================================  ======================  ==========================
``copy_to_model_parallel_region``   identity                all-reduce
``reduce_from_model_parallel_region``  all-reduce           identity
``scatter_to_model_parallel_region``   keep my last-dim slice  all-gather
``gather_from_model_parallel_region``  all-gather last dim  keep my slice
==================================  ======================  ==========================

Each is ``DTensor.from_local`` with the placement the input has, a
``redistribute`` to the placement wanted, and ``to_local``; DTensor's autograd
supplies the backward column.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard

from shim.distributed.layout import current_layout

__all__ = [
    "copy_to_model_parallel_region",
    "gather_from_model_parallel_region",
    "reduce_from_model_parallel_region",
    "scatter_to_model_parallel_region",
]


def _mesh():
    layout = current_layout()
    if layout is None:
        raise RuntimeError("model parallel is not initialized; call initialize_model_parallel() first")
    return layout.tensor_parallel_mesh


def _change(tensor: torch.Tensor, have, want) -> torch.Tensor:
    mesh = _mesh()
    if mesh.size() == 1:
        return tensor
    return DTensor.from_local(tensor, mesh, [have], run_check=False).redistribute(mesh, [want]).to_local()


def copy_to_model_parallel_region(input_: torch.Tensor) -> torch.Tensor:
    mesh = _mesh()
    if mesh.size() == 1:
        return input_
    # Replicated forward; the gradient arrives as per-rank summands (Partial) and is all-reduced.
    return DTensor.from_local(input_, mesh, [Replicate()], run_check=False).to_local(grad_placements=[Partial()])


def reduce_from_model_parallel_region(input_: torch.Tensor) -> torch.Tensor:
    return _change(input_, Partial(), Replicate())


def scatter_to_model_parallel_region(input_: torch.Tensor) -> torch.Tensor:
    return _change(input_, Replicate(), Shard(input_.ndim - 1))


def gather_from_model_parallel_region(input_: torch.Tensor) -> torch.Tensor:
    return _change(input_, Shard(input_.ndim - 1), Replicate())
