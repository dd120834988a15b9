"""Device arguments that say CUDA, mapped to the active device (``shim.device()``).

CUDA-era code names its device as ``'cuda'``, ``'cuda:0'``, ``torch.device('cuda', i)`` or the int
``torch.cuda.current_device()``. ``shim.compat.install()`` wraps the torch calls that take a device
so these land on the active device; other devices pass through untouched.

Why wrapping functions rather than a ``TorchFunctionMode`` (what ``torch.set_default_device`` uses):
a mode is thread-local, so it misses threads the program starts, and it puts a Python call in front
of every torch operation; wrapping touches only the ~40 factories and ``.to``/``.new_*``/``.cuda``
and is seen by every thread. Its limit: a factory imported by name before ``install()``
(``from torch import zeros``) keeps the unwrapped function.
"""

from __future__ import annotations

import functools

import torch

from shim._device import active_device

__all__ = ["TENSOR_METHODS", "device_kwarg_mapped", "factory_names", "load_mapped", "means_cuda", "module_cuda", "tensor_cuda", "tensor_type", "to_mapped", "type_mapped"]


def means_cuda(device) -> bool:
    """True for 'cuda', 'cuda:1', torch.device('cuda') and a bare int index (torch reads it as CUDA)."""
    if isinstance(device, bool):
        return False
    if isinstance(device, int):
        return True
    if isinstance(device, str):
        return device.split(":", 1)[0] == "cuda"
    return isinstance(device, torch.device) and device.type == "cuda"


def _mapped(device):
    return active_device() if means_cuda(device) else device


def factory_names() -> list[str]:
    """Public ``torch.*`` functions whose aten schema takes ``device`` (empty, zeros, arange, tensor...).

    Read from the operator registry rather than listed by hand, so a torch release that adds a
    factory is covered; ``asarray`` is Python-level and has no schema.
    """
    names = ["asarray"]
    for name in dir(torch._C._VariableFunctions):
        if name.startswith("_") or not hasattr(torch, name):
            continue
        schemas = torch._C._jit_get_schemas_for_operator(f"aten::{name}")
        if any(arg.name == "device" for schema in schemas for arg in schema.arguments):
            names.append(name)
    return sorted(names)


# Tensor methods that take a device; pin_memory/is_pinned are left alone (their device names the
# accelerator to pin for, and there is none to map to).
TENSOR_METHODS = ("new_empty", "new_empty_strided", "new_full", "new_ones", "new_tensor", "new_zeros")


def device_kwarg_mapped(fn):
    """``fn`` with a CUDA ``device=`` keyword replaced by the active device."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = _mapped(kwargs["device"])
        return fn(*args, **kwargs)

    return wrapper


def to_mapped(to):
    """``Tensor.to`` / ``Module.to``: the device may also come first, positionally (``x.to('cuda')``)."""

    @functools.wraps(to)
    def wrapper(self, *args, **kwargs):
        if args and means_cuda(args[0]):
            args = (active_device(), *args[1:])
        if "device" in kwargs:
            kwargs["device"] = _mapped(kwargs["device"])
        return to(self, *args, **kwargs)

    return wrapper


def load_mapped(load):
    """``torch.load``: tensors saved on a GPU, and a CUDA ``map_location``, load onto the active device.

    Without ``map_location`` torch restores tensors where they were saved and refuses CUDA ones
    on a machine without CUDA; released GLM checkpoints were saved on GPUs.
    """

    @functools.wraps(load)
    def wrapper(f, map_location=None, *args, **kwargs):
        if map_location is None or means_cuda(map_location):
            map_location = active_device()
        return load(f, map_location, *args, **kwargs)

    return wrapper


def tensor_cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
    """``Tensor.cuda()`` without CUDA: a copy on the active device (the tensor itself if already there)."""
    return self.to(active_device(), non_blocking=non_blocking, memory_format=memory_format)


def module_cuda(self, device=None):
    """``Module.cuda()`` without CUDA: parameters and buffers moved to the active device."""
    return self.to(active_device())


def _cudaless_type_target(dtype):
    """What a ``.type(...)`` argument naming a CUDA type means without CUDA: the CPU type of the
    same dtype (``'torch.cuda.HalfTensor'``, ``torch.cuda.HalfTensor`` as cudaless serves it)."""
    if isinstance(dtype, str) and dtype.startswith("torch.cuda."):
        return "torch." + dtype[len("torch.cuda."):]
    cpu_type = getattr(dtype, "cpu_type", None)  # shim.compat.cudaless's legacy types
    return cpu_type if cpu_type is not None else dtype


def tensor_type(tensor, dtype=None, non_blocking=False, **kwargs):
    """``tensor.type(...)`` as CUDA-era code uses it, on a machine whose active device stands in for CUDA.

    With no dtype, the type's name as that code compares it (``== 'torch.cuda.FloatTensor'``): a tensor
    on the active device, when it is not a CUDA GPU, is named by its ``torch.cuda.*Tensor`` type, the
    type ``torch.cuda.FloatTensor(...)`` builds there. With a dtype naming a CUDA type (the string such
    a name, or ``torch.cuda.HalfTensor``), the conversion to that dtype on the active device. Anything
    else, and any object that is not a tensor (``arr.dtype.type(0)``), is the object's own ``type``."""
    if not isinstance(tensor, torch.Tensor):
        args = () if dtype is None else (dtype,)
        return tensor.type(*args, **kwargs) if not non_blocking else tensor.type(*args, non_blocking, **kwargs)
    active = active_device()
    if dtype is None and not kwargs:
        name = torch._C.TensorBase.type(tensor)  # torch's own, whether or not shim.compat is installed
        if active.type != "cuda" and tensor.device.type == active.type and name.startswith("torch.") \
                and not name.startswith("torch.cuda."):
            return "torch.cuda." + name[len("torch."):]
        return name
    if active.type != "cuda":
        converted = torch._C.TensorBase.type(tensor, _cudaless_type_target(dtype), non_blocking, **kwargs)
        return converted.to(active) if converted.device != active else converted
    return torch._C.TensorBase.type(tensor, dtype, non_blocking, **kwargs)


def type_mapped(type_method):
    """``Tensor.type`` for ``shim.compat.install()``: :func:`tensor_type`'s names and conversions."""

    @functools.wraps(type_method)
    def wrapper(self, dtype=None, non_blocking=False, **kwargs):
        return tensor_type(self, dtype, non_blocking, **kwargs)

    return wrapper
