"""``torch.cuda.nvtx`` that also runs without CUDA: profiler ranges and marks are no-ops when the
active device is not a CUDA GPU (torch's raise "NVTX functions not installed" on CPU builds)."""

from __future__ import annotations

import contextlib

import torch.cuda.nvtx as _nvtx

from shim._device import active_device

__all__ = ['range_push', 'range_pop', 'range_start', 'range_end', 'mark', 'range']


def _cuda() -> bool:
    return active_device().type == "cuda"


def range_push(msg):
    return _nvtx.range_push(msg) if _cuda() else 0


def range_pop():
    return _nvtx.range_pop() if _cuda() else 0


def range_start(msg) -> int:
    return _nvtx.range_start(msg) if _cuda() else 0


def range_end(range_id) -> None:
    if _cuda():
        _nvtx.range_end(range_id)


def mark(msg):
    return _nvtx.mark(msg) if _cuda() else None


@contextlib.contextmanager
def range(msg, *args, **kwargs):
    if _cuda():
        with _nvtx.range(msg, *args, **kwargs):
            yield
    else:
        yield
