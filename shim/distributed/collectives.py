"""torch.distributed's collectives, also meaningful in ONE process with no process group.

GLM-era code calls ``torch.distributed.all_reduce(...)``, ``get_rank()``,
``new_group(...)`` unconditionally. With a process group initialised, every
function here is torch's own call, unchanged. Without one (a plain ``python
script.py``), each takes the meaning it has in a world of size 1: reductions and
broadcasts leave the tensor as it is, gathers copy the input into slot 0, the
rank is 0 and the world size 1. ``new_group`` then returns a
:class:`SingleProcessGroup`, which the same functions accept as ``group``.
"""

from __future__ import annotations

import atexit
import datetime
import functools
import gc
import inspect
import os
import sys

import torch
import torch.distributed as _dist

__all__ = [
    "SingleProcessGroup",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_reduce",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "broadcast_object_list",
    "destroy_process_group",
    "gather",
    "gather_object",
    "get_rank",
    "get_world_size",
    "init_process_group",
    "monitored_barrier",
    "new_group",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "scatter",
    "scatter_object_list",
]


class SingleProcessGroup:
    """The group of one process that ``new_group`` returns when no process group exists."""

    def rank(self) -> int:
        return 0

    def size(self) -> int:
        return 1

    def __repr__(self) -> str:
        return "SingleProcessGroup()"


class _CompletedWork:
    """What ``async_op=True`` returns in one process: the work is already done."""

    def wait(self, timeout: datetime.timedelta | None = None) -> bool:
        return True

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True


def _one_process(torch_fn):
    """Use ``torch_fn`` when a process group exists, else the decorated world-of-one meaning.

    The decorated function receives torch's arguments by name, defaults applied.
    """
    signature = inspect.signature(torch_fn)

    def decorate(alone):
        @functools.wraps(torch_fn)
        def collective(*args, **kwargs):
            if _dist.is_initialized() and not any(
                isinstance(arg, SingleProcessGroup) for arg in (*args, *kwargs.values())
            ):
                return torch_fn(*args, **kwargs)
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            result = alone(**bound.arguments)
            return _CompletedWork() if bound.arguments.get("async_op") else result

        return collective

    return decorate


def _copy(destination: torch.Tensor, source: torch.Tensor) -> None:
    with torch.no_grad():
        destination.copy_(source)


@_one_process(_dist.all_reduce)
def all_reduce(tensor, **_):
    """Sum (or other op) over one rank: the tensor itself."""


@_one_process(_dist.broadcast)
def broadcast(tensor, **_):
    """The only rank is the source."""


@_one_process(_dist.reduce)
def reduce(tensor, **_):
    """Reduction over one rank: the tensor itself."""


@_one_process(_dist.barrier)
def barrier(**_):
    """Nobody to wait for."""


@_one_process(_dist.monitored_barrier)
def monitored_barrier(**_):
    """Nobody to wait for."""


@_one_process(_dist.broadcast_object_list)
def broadcast_object_list(object_list, **_):
    """The only rank is the source."""


@_one_process(_dist.all_gather)
def all_gather(tensor_list, tensor, **_):
    _copy(tensor_list[0], tensor)


@_one_process(_dist.all_gather_into_tensor)
def all_gather_into_tensor(output_tensor, input_tensor, **_):
    _copy(output_tensor, input_tensor)


@_one_process(_dist.all_gather_object)
def all_gather_object(object_list, obj, **_):
    object_list[0] = obj


@_one_process(_dist.gather)
def gather(tensor, gather_list, **_):
    if gather_list:
        _copy(gather_list[0], tensor)


@_one_process(_dist.gather_object)
def gather_object(obj, object_gather_list, **_):
    if object_gather_list:
        object_gather_list[0] = obj


@_one_process(_dist.scatter)
def scatter(tensor, scatter_list, **_):
    _copy(tensor, scatter_list[0])


@_one_process(_dist.scatter_object_list)
def scatter_object_list(scatter_object_output_list, scatter_object_input_list, **_):
    scatter_object_output_list[0] = scatter_object_input_list[0]


@_one_process(_dist.reduce_scatter)
def reduce_scatter(output, input_list, **_):
    _copy(output, input_list[0])


@_one_process(_dist.reduce_scatter_tensor)
def reduce_scatter_tensor(output, input, **_):
    _copy(output, input)


@_one_process(_dist.all_to_all)
def all_to_all(output_tensor_list, input_tensor_list, **_):
    _copy(output_tensor_list[0], input_tensor_list[0])


@_one_process(_dist.all_to_all_single)
def all_to_all_single(output, input, **_):
    _copy(output, input)


@_one_process(_dist.get_rank)
def get_rank(**_) -> int:
    return 0


@_one_process(_dist.get_world_size)
def get_world_size(**_) -> int:
    return 1


@_one_process(_dist.new_group)
def new_group(ranks=None, **_):
    if ranks is not None and sorted(ranks) != [0]:
        raise ValueError(
            f"new_group(ranks={list(ranks)}) without an initialised process group: "
            "one process has only rank 0"
        )
    return SingleProcessGroup()


def init_process_group(backend=None, init_method=None, timeout=None, world_size=-1, rank=-1, store=None, **kwargs):
    """``torch.distributed.init_process_group`` that runs where GLM-era scripts are launched today.

    - ``nccl`` without CUDA becomes ``gloo`` (the scripts hard-code nccl).
    - A world of one (``world_size`` 1, or unset with ``WORLD_SIZE`` unset or 1)
      rendezvous through an in-memory store: no free port, no ``MASTER_ADDR``,
      no launcher needed.
    - On gloo, the groups are destroyed at exit (``atexit``, before the interpreter finalizes) when
      the script never calls ``destroy_process_group``, as GLM's scripts do not: a gloo group freed
      during finalization wakes its workers, which drop their last work's tensors under a GIL that
      is being torn down, and the rank dies with SIGABRT ("terminate called without an active
      exception"). Groups the script itself still references (e.g. mpu's globals) stay until then.
    """
    if backend is not None and "nccl" in str(backend) and not torch.cuda.is_available():
        backend = "gloo"
    if world_size == -1 and os.environ.get("WORLD_SIZE", "1") == "1":
        world_size = 1
    if world_size == 1 and store is None:
        store, init_method, rank = _dist.HashStore(), None, 0
    _dist.init_process_group(
        backend=backend,
        init_method=init_method,
        timeout=timeout,
        world_size=world_size,
        rank=rank,
        store=store,
        **kwargs,
    )
    if _dist.get_backend() == "gloo":
        _destroy_at_exit_once()


@functools.cache
def _destroy_at_exit_once() -> None:
    atexit.register(_destroy_at_exit)


def _destroy_at_exit() -> None:
    if _dist.is_initialized():
        destroy_process_group()


def destroy_process_group(group=None) -> None:
    """``torch.distributed.destroy_process_group``, after which the groups' threads are really gone.

    torch drops its own references, but every ``DeviceMesh`` keeps its dims' groups in
    ``_pg_registry``, and DTensor's sharding and redistribute caches keep the meshes: after a
    DTensor collective, torch's call leaves each gloo group alive, two ``pt_gloo_runloop`` and one
    ``gloo_tcp_loop`` thread apiece, until interpreter shutdown. A thread that then touches a
    Python object is ended by the finalizing interpreter (``pthread_exit``) inside a ``noexcept``
    frame: "terminate called without an active exception", SIGABRT at exit, now and then. Here
    the meshes let go of the destroyed groups, so they are freed (threads joined) at this call.
    """
    whole_world = group is None or group is _dist.GroupMember.WORLD
    destroyed = set(_dist.distributed_c10d._world.pg_map) if whole_world else {group}
    _dist.destroy_process_group(group)
    layout = sys.modules.get("shim.distributed.layout")  # loaded once a layout may exist (layout imports us)
    if whole_world and layout is not None:
        layout.reset_layout()  # its meshes name groups that no longer exist
    _forget_in_device_meshes(destroyed)


def _forget_in_device_meshes(groups) -> None:
    device_mesh = sys.modules.get("torch.distributed.device_mesh")
    if device_mesh is None or not groups:
        return  # no mesh was ever built
    mesh_type = device_mesh.DeviceMesh
    for obj in gc.get_objects():
        if type(obj) is mesh_type:
            registry = getattr(obj, "_pg_registry", None) or {}
            for name in [name for name, pg in registry.items() if pg in groups]:
                del registry[name]
    gc.collect()
