"""Megatron's ``megatron.fused_kernels.load(args)``: builds its softmax and layer-norm CUDA extensions
with nvcc at start-up. Under shim those extensions are :mod:`shim.kernels` modules, so there is nothing
to build; ``load`` says so once and returns."""

from __future__ import annotations

import sys

__all__ = ['load']

_said = False


def load(args=None) -> None:
    """No-op: the fused kernels Megatron would compile are served by shim.kernels (torch ops)."""
    global _said
    if not _said and getattr(args, "rank", 0) == 0:
        print("> fused kernels: nothing to compile; scaled_masked_softmax_cuda, scaled_upper_triang_masked_"
              "softmax_cuda and fused_mix_prec_layer_norm_cuda come from shim.kernels (torch ops)",
              file=sys.stderr, flush=True)
    _said = True
