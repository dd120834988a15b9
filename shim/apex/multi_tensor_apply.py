"""apex's ``multi_tensor_applier``: ``multi_tensor_applier(op, noop_flag_buffer, tensor_lists, *args)``
calls ``op(chunk_size, noop_flag_buffer, tensor_lists, *args)``, as apex does. With ``op`` an ``amp_C``
kernel from :mod:`shim.kernels.amp_C` the work runs on ``torch._foreach_*``, on any device."""

from __future__ import annotations

__all__ = ['MultiTensorApply', 'multi_tensor_applier']


class MultiTensorApply:
    available = True  # apex: False when its amp_C extension was not built; shim's always is
    warned = False

    def __init__(self, chunk_size: int):
        self.chunk_size = chunk_size

    def check_avail(self) -> None:
        """apex raises here when amp_C is missing; shim's kernels are always there."""

    def __call__(self, op, noop_flag_buffer, tensor_lists, *args):
        return op(self.chunk_size, noop_flag_buffer, tensor_lists, *args)


multi_tensor_applier = MultiTensorApply(2048 * 32)
