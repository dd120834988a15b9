"""What ``torch.cuda`` calls mean on a machine whose active device is not a CUDA GPU.

GLM-era code says ``torch.cuda`` when it means "the accelerator this process trains on". Without
CUDA that is ``shim.device()`` (normally the CPU), and each name here gives the call that meaning:

- one device, index 0: ``device_count() == 1`` (GLM computes ``rank % device_count()``, so 0 would
  divide by zero), ``current_device() == 0``, ``set_device(0)`` accepted, any other index refused;
- legacy tensor types (``LongTensor([1, 2])``, ``FloatTensor(3, 4)``) build on the active device;
- the random generator *is* the CPU default generator: ``manual_seed``, ``get_rng_state``,
  ``default_generators[0]``... act on ``torch.default_generator``, which is what CPU dropout draws
  from, so Megatron's RNG tracker forks the stream that really drives the model;
- streams, events, ``synchronize`` and device contexts are no-ops: CPU work runs in order;
- ``_lazy_call`` runs its callable at once (there is no device to initialise later);
- memory counters are 0 and their resets no-ops: there is no device allocator to count; process RSS
  would mix in the interpreter and libraries and is not what these counters mean.

Every name in ``__all__`` is served by ``shim.cuda`` and installed on ``torch.cuda`` by
``shim.compat.install()``.
"""

from __future__ import annotations

import contextlib
import threading
import time

import torch

from shim._device import active_device

__all__ = [
    "device_count", "current_device", "set_device", "device", "device_of",
    "synchronize", "_lazy_call",
    "manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed",
    "get_rng_state", "set_rng_state", "get_rng_state_all", "set_rng_state_all", "default_generators",
    "Stream", "Event", "stream", "current_stream", "default_stream",
    "memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved",
    "memory_cached", "max_memory_cached", "reset_max_memory_allocated", "reset_max_memory_cached",
    "reset_peak_memory_stats", "reset_accumulated_memory_stats", "empty_cache", "memory_stats",
    "FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "LongTensor", "IntTensor",
    "ShortTensor", "CharTensor", "ByteTensor", "BoolTensor",
]  # fmt: skip


# ---- devices: exactly one, index 0 ----------------------------------------------------------------


def device_count() -> int:
    return 1


def current_device() -> int:
    return 0


def _index(dev) -> int | None:
    if dev is None or isinstance(dev, int):
        return dev
    return torch.device(dev).index


def set_device(dev) -> None:
    index = _index(dev)
    if index is not None and index > 0:
        raise ValueError(
            f"torch.cuda.set_device({dev!r}): without CUDA there is one device, index 0 "
            f"(the active device {active_device()}); use rank % torch.cuda.device_count()"
        )


class device(contextlib.nullcontext):
    """``with torch.cuda.device(i):`` selects nothing: there is one device."""

    def __init__(self, dev=None):
        super().__init__()
        self.idx = _index(dev)


class device_of(device):
    def __init__(self, obj):
        super().__init__(None)


def synchronize(device=None) -> None:
    """CPU work is synchronous: nothing to wait for."""


def _lazy_call(callable, **kwargs):
    callable()


# ---- random numbers: the CPU default generator ----------------------------------------------------
# Implemented on torch.default_generator directly: torch.manual_seed itself calls
# torch.cuda.manual_seed_all, so going through torch.manual_seed would recurse once installed.


def manual_seed(seed: int) -> None:
    torch.default_generator.manual_seed(int(seed))


manual_seed_all = manual_seed


def seed() -> None:
    torch.default_generator.seed()


seed_all = seed


def initial_seed() -> int:
    return torch.default_generator.initial_seed()


def get_rng_state(device="cuda") -> torch.Tensor:
    return torch.default_generator.get_state()


def set_rng_state(new_state: torch.Tensor, device="cuda") -> None:
    torch.default_generator.set_state(new_state)


def get_rng_state_all() -> list[torch.Tensor]:
    return [get_rng_state()]


def set_rng_state_all(new_states) -> None:
    for state in new_states:
        set_rng_state(state)


default_generators = (torch.default_generator,)


# ---- streams and events: in-order, nothing to wait for --------------------------------------------


class Event:
    """``torch.cuda.Event``: recorded work is always complete; with ``enable_timing`` the record
    time is the wall clock, which on an in-order device is when the work before it finished."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing = enable_timing
        self._recorded_at: float | None = None

    def record(self, stream=None) -> None:
        self._recorded_at = time.perf_counter()

    def elapsed_time(self, end_event: "Event") -> float:
        """Milliseconds from this event to ``end_event``, as torch.cuda.Event reports them."""
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with enable_timing=True to measure elapsed time")
        if self._recorded_at is None or end_event._recorded_at is None:
            raise RuntimeError("Both events must be recorded before measuring elapsed time")
        return (end_event._recorded_at - self._recorded_at) * 1e3

    def wait(self, stream=None) -> None:
        """Nothing to wait for."""

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        """Nothing to wait for."""


class Stream:
    """``torch.cuda.Stream(device=..., priority=...)`` on an in-order device: nothing ever waits."""

    def __init__(self, device=None, priority: int = 0, **kwargs):
        self.device = active_device()
        self.priority = priority

    def wait_stream(self, stream) -> None:
        """Work on ``stream`` is already done."""

    def wait_event(self, event) -> None:
        """``event`` is already complete."""

    def record_event(self, event: Event | None = None) -> Event:
        return event or Event()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        """Nothing queued."""


_default_stream = Stream()
_selected = threading.local()  # like CUDA's, the current stream is per thread


def current_stream(device=None) -> Stream:
    return getattr(_selected, "stream", _default_stream)


def default_stream(device=None) -> Stream:
    return _default_stream


@contextlib.contextmanager
def stream(selected: Stream | None):
    """``with torch.cuda.stream(s):`` makes ``s`` current for the block (``None``: no change)."""
    if selected is None:
        yield
        return
    previous = current_stream()
    _selected.stream = selected
    try:
        yield
    finally:
        _selected.stream = previous


# ---- memory counters: no device allocator, nothing to count ---------------------------------------


def memory_allocated(device=None) -> int:
    return 0


max_memory_allocated = memory_reserved = max_memory_reserved = memory_allocated
memory_cached = max_memory_cached = memory_allocated


def reset_peak_memory_stats(device=None) -> None:
    """Peaks of a counter that stays 0."""


reset_max_memory_allocated = reset_max_memory_cached = reset_accumulated_memory_stats = reset_peak_memory_stats


def empty_cache() -> None:
    """No cache to empty."""


def memory_stats(device=None) -> dict:
    return {}


# ---- legacy tensor types: torch.cuda.FloatTensor & co on the active device ------------------------


class _LegacyTensorType(type):
    """``torch.cuda.XTensor``: the CPU legacy constructor, moved to the active device.

    Calls accept what the legacy types accept (``LongTensor([1, 2])``, ``FloatTensor(3, 4)``,
    ``FloatTensor(torch.Size(...))``); ``isinstance(t, FloatTensor)`` checks dtype and device type.
    """

    def __call__(cls, *args, **kwargs) -> torch.Tensor:
        return cls.cpu_type(*args, **kwargs).to(active_device())

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, torch.Tensor) and obj.dtype == cls.dtype and obj.device.type == active_device().type


def _legacy_type(name: str) -> _LegacyTensorType:
    cpu_type = getattr(torch, name)
    return _LegacyTensorType(name, (), {"cpu_type": cpu_type, "dtype": cpu_type.dtype, "__module__": "torch.cuda"})


FloatTensor = _legacy_type("FloatTensor")
DoubleTensor = _legacy_type("DoubleTensor")
HalfTensor = _legacy_type("HalfTensor")
BFloat16Tensor = _legacy_type("BFloat16Tensor")
LongTensor = _legacy_type("LongTensor")
IntTensor = _legacy_type("IntTensor")
ShortTensor = _legacy_type("ShortTensor")
CharTensor = _legacy_type("CharTensor")
ByteTensor = _legacy_type("ByteTensor")
BoolTensor = _legacy_type("BoolTensor")
