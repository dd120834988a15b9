"""apex's ``FusedLayerNorm`` as ``torch.nn.LayerNorm``, whose CPU and CUDA kernels are fused already.

Same constructor as apex, same parameter names and state dict as ``torch.nn.LayerNorm`` (it is one).
``memory_efficient`` (apex: keep the output instead of the input for backward) is accepted and kept
as an attribute; torch's kernel decides what it saves. Half or bfloat16 inputs with fp32 weights,
apex's "mixed" case, are accepted by torch's kernels themselves (output in the input's dtype), so
``MixedFusedLayerNorm`` is the same class.
"""

from __future__ import annotations

import torch

__all__ = ["FusedLayerNorm", "MixedFusedLayerNorm"]


class FusedLayerNorm(torch.nn.LayerNorm):
    def __init__(
        self,
        normalized_shape,
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        memory_efficient: bool = False,
        *,
        device=None,
        dtype=None,
    ):
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine, device=device, dtype=dtype)
        self.memory_efficient = memory_efficient

    def extra_repr(self) -> str:
        return super().extra_repr() + (", memory_efficient=True" if self.memory_efficient else "")


MixedFusedLayerNorm = FusedLayerNorm
