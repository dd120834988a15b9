"""``shim.cuda``: ``torch.cuda``, portable to machines whose active device is not a CUDA GPU.

When ``shim.device()`` is a CUDA device every name is ``torch.cuda``'s own object, except the
``*_cached`` memory counters that torch deprecated, which answer with their ``*_reserved`` renames.
Otherwise the names GLM-era code calls (``FloatTensor``, ``set_device``, ``manual_seed``,
``get_rng_state``, ``Stream``...) take their meaning from ``shim.compat.cudaless``, and the rest,
``is_available()`` included, stay ``torch.cuda``'s: availability is never faked.

The choice is made on each attribute access, so ``SHIM_DEVICE`` set before a name is looked up
decides which one it gets. A package, so that ``import shim.cuda.amp`` (any torch.cuda submodule)
resolves to torch's module as everywhere else in shim.
"""

import torch as _torch

from shim._device import active_device as _active_device
from shim._forward import forward_to as _forward_to
from shim.compat import cudaless as _cudaless

_RENAMED = {"memory_cached": "memory_reserved", "max_memory_cached": "max_memory_reserved"}
_CUDALESS = frozenset(_cudaless.__all__)

_torch_getattr, _torch_dir = _forward_to(_torch.cuda, globals())


def __getattr__(name: str):
    if name == "nvtx":  # shim's own submodule: ranges that are no-ops without CUDA
        import shim.cuda.nvtx as nvtx

        return nvtx
    if name in _CUDALESS and _active_device().type != "cuda":
        return getattr(_cudaless, name)
    return _torch_getattr(_RENAMED.get(name, name))


def __dir__():
    return sorted(set(_torch_dir()) | _CUDALESS)
