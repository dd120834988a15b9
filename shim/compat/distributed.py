"""torch.distributed and DDP calls that assume GPUs, made to work on CPU processes."""

from __future__ import annotations

import functools

__all__ = ["ddp_init_without_gpu_ids", "nccl_as_gloo"]


def _gloo_for_nccl(backend):
    return "gloo" if isinstance(backend, str) and backend.lower() == "nccl" else backend


def nccl_as_gloo(fn, position: int):
    """``fn`` with a ``backend`` argument (keyword, or positional at ``position``) of nccl given as gloo."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if "backend" in kwargs:
            kwargs["backend"] = _gloo_for_nccl(kwargs["backend"])
        elif len(args) > position:
            args = (*args[:position], _gloo_for_nccl(args[position]), *args[position + 1 :])
        return fn(*args, **kwargs)

    return wrapper


def ddp_init_without_gpu_ids(init):
    """DDP's ``__init__`` dropping ``device_ids`` / ``output_device`` for a module with no CUDA parameters.

    GLM passes its GPU index (``device_ids=[i], output_device=i``); torch refuses both for CPU
    modules, where they mean nothing.
    """

    @functools.wraps(init)
    def __init__(self, module, device_ids=None, output_device=None, *args, **kwargs):
        if not any(p.is_cuda for p in module.parameters()):
            device_ids = output_device = None
        init(self, module, device_ids, output_device, *args, **kwargs)

    return __init__
