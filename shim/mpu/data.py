"""Megatron's ``broadcast_data``: model-parallel rank 0 reads the batch, its group receives it."""

from __future__ import annotations

import torch

from shim._device import active_device
from shim.distributed.collectives import broadcast, broadcast_object_list
from shim.mpu.initialize import get_model_parallel_group, get_model_parallel_rank, get_model_parallel_src_rank

__all__ = ["broadcast_data"]


def broadcast_data(keys, data, datatype):
    """``{key: data[key]}`` on every rank of the model-parallel group, on the active device.

    Only model-parallel rank 0 needs ``data``; all its ``keys`` must be of ``datatype``.
    Two broadcasts: the shapes, then every tensor flattened into one buffer.
    """
    group, src = get_model_parallel_group(), get_model_parallel_src_rank()
    shapes = [None]
    if get_model_parallel_rank() == 0:
        for key in keys:
            if data[key].dtype != datatype:
                raise TypeError(f"broadcast_data: {key!r} has dtype {data[key].dtype}, expected {datatype}")
        shapes = [[tuple(data[key].shape) for key in keys]]
    broadcast_object_list(shapes, src=src, group=group)
    sizes = [int(torch.Size(shape).numel()) for shape in shapes[0]]
    if get_model_parallel_rank() == 0:
        flat = torch.cat([data[key].reshape(-1) for key in keys]).to(active_device())
    else:
        flat = torch.empty(sum(sizes), dtype=datatype, device=active_device())
    broadcast(flat, src, group=group)
    return {key: piece.view(shape) for key, piece, shape in zip(keys, flat.split(sizes), shapes[0])}
