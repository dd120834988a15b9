"""OneFlow-style global tensors, which are DTensors.

- ``placement(device_type, ranks)``: the devices a tensor spreads over. ``ranks``
  is a list (a 1-D mesh) or a nested list (a grid); the result is a DeviceMesh.
- ``to_global(t, placement=, sbp=)``: a local tensor becomes the global tensor
  whose local piece on this rank is ``t`` (``DTensor.from_local``: nothing is
  sent, so a ``broadcast`` tensor must already be equal on every rank). A global
  tensor is redistributed to the new ``sbp`` (``DTensor.redistribute``).
- ``to_local(t)``: this rank's piece.
- ``enable_tensor_methods()``: also as ``t.to_global(...)`` / ``t.to_local()``,
  ``t.sbp`` / ``t.placement``; an explicit, reversible change to torch.Tensor.

One process with no launcher is a world of one: every placement is ``[0]``.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.distributed as _dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import DTensor, Placement

from shim._device import active_device
from shim.distributed.collectives import init_process_group

__all__ = [
    "disable_tensor_methods",
    "enable_tensor_methods",
    "is_global",
    "placement",
    "to_global",
    "to_local",
]

# (the default process group these meshes belong to, {(device_type, rank grid): mesh})
_meshes: tuple[object, dict[tuple, DeviceMesh]] = (None, {})


def _nested_tuple(ranks):
    if isinstance(ranks, torch.Tensor):
        ranks = ranks.tolist()
    if isinstance(ranks, Sequence) and not isinstance(ranks, str):
        return tuple(_nested_tuple(r) for r in ranks)
    return int(ranks)


def _flat(ranks) -> list[int]:
    return [r for sub in ranks for r in _flat(sub)] if isinstance(ranks, tuple) else [ranks]


def placement(device_type: str = "cpu", ranks=None) -> DeviceMesh:
    """The DeviceMesh over ``ranks`` (default: every rank) on ``device_type``.

    ``"cuda"`` means shim's active device (``shim.device()``), so the same script
    runs with and without GPUs.
    Making a mesh is collective: every rank calls ``placement`` with the same
    arguments in the same order (results are cached).
    """
    if device_type == "cuda":
        device_type = active_device().type
    if not _dist.is_initialized():
        init_process_group("nccl" if device_type == "cuda" else "gloo")
    world_size = _dist.get_world_size()
    grid = _nested_tuple(list(range(world_size)) if ranks is None else ranks)
    if not isinstance(grid, tuple):
        grid = (grid,)
    flat = _flat(grid)
    if len(set(flat)) != len(flat) or not all(0 <= r < world_size for r in flat):
        raise ValueError(f"placement ranks {ranks!r} must be distinct ranks in [0, {world_size})")
    try:
        rank_grid = torch.tensor(grid)
    except ValueError:
        raise ValueError(f"placement ranks {ranks!r} must be a list or a rectangular grid of ranks") from None
    global _meshes
    if _meshes[0] is not _dist.group.WORLD:  # a new process group: meshes of the old one are stale
        _meshes = (_dist.group.WORLD, {})
    cache = _meshes[1]
    key = (device_type, grid)
    if key not in cache:
        cache[key] = DeviceMesh(device_type, rank_grid)
    return cache[key]


def _placements(sbp, mesh: DeviceMesh) -> tuple[Placement, ...]:
    sbp = (sbp,) if isinstance(sbp, Placement) else tuple(sbp)
    if len(sbp) != mesh.ndim or not all(isinstance(s, Placement) for s in sbp):
        raise ValueError(f"sbp {sbp!r} must give one shim.sbp value per placement dim ({mesh.ndim})")
    return sbp


def is_global(tensor) -> bool:
    return isinstance(tensor, DTensor)


def to_global(tensor: torch.Tensor, placement: DeviceMesh | None = None, sbp=None) -> DTensor:
    """The global tensor with this rank's piece ``tensor``; on a global tensor, redistribute to ``sbp``."""
    if isinstance(tensor, DTensor):
        if placement is not None and placement != tensor.device_mesh:
            raise ValueError(
                "to_global cannot move a global tensor to another placement; "
                "pipeline stages exchange activations through torch.distributed.pipelining"
            )
        if sbp is None:
            return tensor
        return tensor.redistribute(tensor.device_mesh, _placements(sbp, tensor.device_mesh))
    if placement is None or sbp is None:
        raise ValueError("to_global on a local tensor needs both placement= and sbp=")
    return DTensor.from_local(tensor, placement, _placements(sbp, placement), run_check=False)


def to_local(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's piece of a global tensor (a local tensor is its own piece)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


_TENSOR_METHODS = {
    "to_global": to_global,
    "to_local": to_local,
    "is_global": property(is_global),
    "sbp": property(lambda self: tuple(self.placements) if isinstance(self, DTensor) else None),
    "placement": property(lambda self: self.device_mesh if isinstance(self, DTensor) else None),
}


def enable_tensor_methods() -> None:
    """Add ``to_global``, ``to_local``, ``is_global``, ``sbp``, ``placement`` to torch.Tensor.

    DTensor's own ``to_local`` is untouched. Undo with :func:`disable_tensor_methods`.
    """
    for name, value in _TENSOR_METHODS.items():
        if name in vars(torch.Tensor) and vars(torch.Tensor)[name] is not value:
            raise RuntimeError(f"torch.Tensor already has {name!r}; not overriding it")
        setattr(torch.Tensor, name, value)


def disable_tensor_methods() -> None:
    for name, value in _TENSOR_METHODS.items():
        if vars(torch.Tensor).get(name) is value:
            delattr(torch.Tensor, name)
