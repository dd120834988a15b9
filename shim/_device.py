"""``shim.device``: ``torch.device`` that, called with no argument, answers "where should tensors go?".

``shim.device()`` is the *active device*:

1. ``$SHIM_DEVICE`` when set (any torch device string: ``cpu``, ``cuda:1``, ``mps``...);
2. ``cuda:$LOCAL_RANK`` (modulo the number of GPUs) when CUDA is available;
3. ``cpu`` otherwise.

With arguments it is ``torch.device`` itself (``shim.device("cuda", 0) == torch.device("cuda", 0)``),
and ``isinstance(torch.device("cpu"), shim.device)`` holds. ``torch.device`` is final (it cannot
be subclassed), so ``shim.device`` is a class whose constructor returns ``torch.device`` objects and
whose metaclass answers ``isinstance`` / ``issubclass`` for ``torch.device``.
"""

from __future__ import annotations

import os

import torch

ENV_VAR = "SHIM_DEVICE"


def active_device() -> torch.device:
    """The device GLM-era code means by "cuda": see the module docstring for the order of choice."""
    override = os.environ.get(ENV_VAR)
    if override:
        try:
            return torch.device(override)
        except RuntimeError:
            raise ValueError(f"{ENV_VAR}={override!r} is not a torch device string (e.g. 'cpu', 'cuda:0')") from None
    if torch.cuda.is_available():
        local_rank = os.environ.get("LOCAL_RANK", "0")
        if not local_rank.isdigit():
            raise ValueError(f"LOCAL_RANK={local_rank!r} is not a non-negative integer")
        local_rank = int(local_rank)
        return torch.device("cuda", local_rank % torch.cuda.device_count())
    return torch.device("cpu")


class _DeviceType(type):
    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, torch.device)

    def __subclasscheck__(cls, sub) -> bool:
        return issubclass(sub, torch.device)


class device(metaclass=_DeviceType):
    """``torch.device``; ``device()`` with no argument is the active device (see module docstring)."""

    def __new__(cls, *args, **kwargs) -> torch.device:
        if not args and not kwargs:
            return active_device()
        return torch.device(*args, **kwargs)
