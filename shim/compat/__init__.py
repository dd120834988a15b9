"""``shim.compat``: shim's portability applied to torch itself, for code that still says ``torch.cuda``.

``install()`` patches torch in place, ``uninstall()`` puts back every patched attribute exactly (the
very objects, or their absence), and both are idempotent. When the active device
(``shim.device()``) is not CUDA, install makes these work:

- ``torch.cuda.*`` as in ``shim.cuda`` (``FloatTensor``, ``set_device``, ``manual_seed``,
  ``get_rng_state``, ``_lazy_call``, ``Stream``, memory counters...; ``is_available()`` stays honest);
- ``Tensor.cuda()`` / ``Module.cuda()`` and CUDA devices (``'cuda'``, ``torch.device('cuda', i)``, the
  int ``torch.cuda.current_device()``) given to factories, ``.to()``, ``Tensor.new_*`` and
  ``torch.load(map_location=...)``: they land on the active device, as do GPU-saved tensors loaded
  without a ``map_location`` (see ``shim.compat.devices``);
- ``tensor.type()`` of a tensor on the active device names its ``torch.cuda.*Tensor`` type (what
  CUDA-era code compares it with), as ``shim.compat.devices.tensor_type``;
- ``init_process_group`` / ``new_group`` with ``backend='nccl'``: gloo;
- ``DistributedDataParallel(module, device_ids=[i], output_device=i)`` on a CPU module: the ids are dropped.

The wrapped factories are registered in TorchScript's builtin table too, so ``torch.jit.script``
still compiles code that calls them.

Always (torch 2 removed it): ``torch._six`` is ``shim.compat.six``, as attribute and importable module.
Always (torch 2.6 changed it): ``torch.load`` defaults to ``weights_only=False`` again, so GLM's
checkpoints (a Namespace and RNG states beside the weights) load; the trust decision is in
``shim.compat.serialization``.

On a CUDA device only ``torch._six`` and ``torch.load``'s default are installed: everything else
already works there.
"""

from __future__ import annotations

import contextlib
import sys
import threading

import torch
import torch.nn.parallel

from shim._device import active_device
from shim.compat import cudaless, devices, distributed, serialization, six

_ABSENT = object()
_lock = threading.Lock()
_saved: list[tuple[object, object, object]] | None = None  # (owner, name, original), in install order


def _patches() -> list[tuple[object, str, object]]:
    """(owner, name, replacement) for everything install() changes; owner is a module, class or dict."""
    patches: list[tuple[object, str, object]] = [(torch, "_six", six), (sys.modules, "torch._six", six)]
    load = serialization.trusting_load(torch.load)
    if active_device().type == "cuda":
        return patches + [(torch, "load", load)]
    patches += [(torch.cuda, name, getattr(cudaless, name)) for name in cudaless.__all__]
    factories = {name: (getattr(torch, name), devices.device_kwarg_mapped(getattr(torch, name))) for name in devices.factory_names()}
    patches += [(torch, name, wrapper) for name, (_, wrapper) in factories.items()]
    # TorchScript knows torch.zeros & co by object identity; without these entries it would try to
    # compile the wrappers. Scripted code gets the aten op itself (and no device mapping).
    builtins = torch.jit._builtins._get_builtin_table()
    patches += [
        (builtins, id(wrapper), builtins[id(original)])
        for original, wrapper in factories.values()
        if id(original) in builtins
    ]
    patches += [(torch.Tensor, name, devices.device_kwarg_mapped(getattr(torch.Tensor, name))) for name in devices.TENSOR_METHODS]
    patches += [
        (torch.Tensor, "to", devices.to_mapped(torch.Tensor.to)),
        (torch.nn.Module, "to", devices.to_mapped(torch.nn.Module.to)),
        (torch.nn.Module, "to_empty", devices.device_kwarg_mapped(torch.nn.Module.to_empty)),
        (torch.Tensor, "cuda", devices.tensor_cuda),
        (torch.Tensor, "type", devices.type_mapped(torch.Tensor.type)),
        (torch.nn.Module, "cuda", devices.module_cuda),
        (torch, "load", devices.load_mapped(load)),
    ]
    if torch.distributed.is_available():  # some builds (e.g. macOS wheels of old) lack it
        from torch.distributed import distributed_c10d as c10d

        for owner in (torch.distributed, c10d):
            patches.append((owner, "init_process_group", distributed.nccl_as_gloo(c10d.init_process_group, position=0)))
            patches.append((owner, "new_group", distributed.nccl_as_gloo(c10d.new_group, position=2)))
        ddp = torch.nn.parallel.DistributedDataParallel
        patches.append((ddp, "__init__", distributed.ddp_init_without_gpu_ids(ddp.__init__)))
    return patches


def _namespace(owner) -> dict:
    return owner if isinstance(owner, dict) else vars(owner)


def _put(owner, name, value) -> None:
    """Set ``owner.name`` (an item when ``owner`` is a dict); delete it when ``value`` is _ABSENT."""
    if isinstance(owner, dict):
        if value is _ABSENT:
            owner.pop(name, None)
        else:
            owner[name] = value
    elif value is _ABSENT:
        delattr(owner, name)
    else:
        setattr(owner, name, value)


def _restore(saved: list[tuple[object, str, object]]) -> None:
    for owner, name, original in reversed(saved):
        _put(owner, name, original)


def _qualified(owner, name, value) -> str:
    if owner is sys.modules:
        return f"sys.modules[{name!r}]"
    if isinstance(owner, dict):  # TorchScript's builtin table
        return f"torch.jit builtin table: wrapped {value.split('::')[-1]} -> {value}"
    prefix = owner.__name__ if isinstance(owner, type(sys)) else f"{owner.__module__}.{owner.__qualname__}"
    return f"{prefix}.{name}"


def planned_changes() -> list[str]:
    """What install() would change on this machine, as qualified names (``torch.cuda.FloatTensor``...)."""
    return [_qualified(owner, name, value) for owner, name, value in _patches()]


def install() -> None:
    """Make CUDA-era torch calls run on the active device (see module docstring). Idempotent."""
    global _saved
    with _lock:
        if _saved is not None:
            return
        patches = _patches()
        # raw namespace values (not getattr), so descriptors such as staticmethods come back as they were
        saved = [(owner, name, _namespace(owner).get(name, _ABSENT)) for owner, name, _ in patches]
        applied: list[tuple[object, str, object]] = []
        try:
            for (owner, name, value), original in zip(patches, saved):
                _put(owner, name, value)
                applied.append(original)
        except BaseException:  # never leave torch half-patched
            _restore(applied)
            raise
        _saved = saved


def uninstall() -> None:
    """Put back every attribute install() changed, exactly as it was. Idempotent."""
    global _saved
    with _lock:
        if _saved is None:
            return
        _restore(_saved)
        _saved = None


def is_installed() -> bool:
    return _saved is not None


@contextlib.contextmanager
def installed():
    """``with shim.compat.installed():`` install for the block, then leave torch as it was."""
    was_installed = is_installed()
    install()
    try:
        yield
    finally:
        if not was_installed:
            uninstall()


__all__ = ["install", "uninstall", "is_installed", "installed", "planned_changes", "six"]
