"""All-reduce many tensors at once, one flat buffer per dtype: gradient buckets without private torch helpers.

``all_reduce_flat(grads, group=g, average=True)`` does what hand-written gradient syncs do with
``torch._utils._flatten_dense_tensors`` / ``_unflatten_dense_tensors`` (private to torch) around
one ``all_reduce``: tensors of one dtype and device are concatenated into one buffer, reduced
with one collective, and copied back in place. With no process group (one process) the
reduction is the identity, as for every collective in :mod:`shim.distributed`.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.distributed as _dist

from shim.distributed.collectives import all_reduce, get_world_size

__all__ = ["all_reduce_flat"]


def all_reduce_flat(
    tensors: Iterable[torch.Tensor], op=_dist.ReduceOp.SUM, group=None, *, average: bool = False
) -> None:
    """Reduce every tensor of ``tensors`` in place over ``group``, one collective per (dtype, device).

    ``average=True`` divides the sums by the group's size (gloo has no ``ReduceOp.AVG``).
    """
    buckets: dict[tuple, list[torch.Tensor]] = {}
    for tensor in tensors:
        if not isinstance(tensor, torch.Tensor) or tensor.is_sparse:
            raise TypeError(f"all_reduce_flat: expected dense tensors, got {type(tensor).__name__}")
        buckets.setdefault((tensor.dtype, tensor.device), []).append(tensor)
    if average and op != _dist.ReduceOp.SUM:
        raise ValueError("all_reduce_flat: average=True needs op=ReduceOp.SUM")
    size = get_world_size(group=group)
    for bucket in buckets.values():
        flat = torch.cat([tensor.reshape(-1) for tensor in bucket])
        all_reduce(flat, op=op, group=group)
        if average:
            flat.div_(size)
        for tensor, piece in zip(bucket, flat.split([tensor.numel() for tensor in bucket])):
            tensor.copy_(piece.view_as(tensor))
