"""Megatron's / apex.transformer's ``FusedScaleMaskSoftmax`` and ``AttnMaskType``, on :mod:`shim.ops.softmax`.

Same constructor and behaviour: when the fused kernel would run (fp16/bf16 input, fusion requested,
a mask or causal type, the kernel's shape limits), the softmax is :func:`shim.ops.softmax.scaled_masked_softmax`
(padding) or :func:`~shim.ops.softmax.scaled_upper_triang_masked_softmax` (causal), fp32 inside, the
input's dtype out; otherwise it is the unfused path: optional fp32 upcast, ``* scale``, ``mask_func``,
softmax, cast back. Both follow the kernels' documented math (see :mod:`shim.ops.softmax`).
"""

from __future__ import annotations

import enum

import torch

from shim.ops.softmax import batch_per_block, scaled_masked_softmax, scaled_upper_triang_masked_softmax

__all__ = ['AttnMaskType', 'FusedScaleMaskSoftmax']


class AttnMaskType(enum.Enum):
    padding = 1
    causal = 2


class FusedScaleMaskSoftmax(torch.nn.Module):
    def __init__(self, input_in_fp16, input_in_bf16, attn_mask_type, scaled_masked_softmax_fusion, mask_func,
                 softmax_in_fp32, scale):
        super().__init__()
        if input_in_fp16 and input_in_bf16:
            raise ValueError("FusedScaleMaskSoftmax: input_in_fp16 and input_in_bf16 cannot both be set")
        if scale is not None and not softmax_in_fp32:
            raise ValueError("FusedScaleMaskSoftmax: a scale needs softmax_in_fp32=True")
        self.input_in_fp16 = input_in_fp16
        self.input_in_bf16 = input_in_bf16
        self.input_in_float16 = input_in_fp16 or input_in_bf16
        self.attn_mask_type = attn_mask_type
        self.scaled_masked_softmax_fusion = scaled_masked_softmax_fusion
        self.mask_func = mask_func
        self.softmax_in_fp32 = softmax_in_fp32
        self.scale = scale

    def _causal(self) -> bool:
        return getattr(self.attn_mask_type, "name", None) == "causal"

    def is_kernel_available(self, mask, b, np, sq, sk) -> bool:
        attn_batches = b * np
        if not (self.scaled_masked_softmax_fusion and self.input_in_float16 and (mask is not None or self._causal())
                and 16 < sk <= 2048 and sq % 4 == 0 and attn_batches % 4 == 0):
            return False
        per_block = batch_per_block(sq, sk, b, np)
        return attn_batches % per_block == 0 if self._causal() else sq % per_block == 0

    def forward(self, input, mask):
        if input.dim() != 4:
            raise ValueError(f"FusedScaleMaskSoftmax: expected [b, np, sq, sk], got shape {tuple(input.shape)}")
        if self.is_kernel_available(mask, *input.size()):
            return self.forward_fused_softmax(input, mask)
        return self.forward_torch_softmax(input, mask)

    def forward_fused_softmax(self, input, mask):
        b, np, sq, sk = input.size()
        scale = self.scale if self.scale is not None else 1.0
        if self._causal():
            if sq != sk:
                raise ValueError("FusedScaleMaskSoftmax: the causal mask is for self attention (sq == sk)")
            return scaled_upper_triang_masked_softmax(input.view(-1, sq, sk), scale).view(b, np, sq, sk)
        return scaled_masked_softmax(input, mask, scale)

    def forward_torch_softmax(self, input, mask):
        if self.input_in_float16 and self.softmax_in_fp32:
            input = input.float()
        if self.scale is not None:
            input = input * self.scale
        scores = self.mask_func(input, mask) if mask is not None else input
        probs = torch.nn.functional.softmax(scores, dim=-1)
        if self.input_in_float16 and self.softmax_in_fp32:
            probs = probs.half() if self.input_in_fp16 else probs.bfloat16()
        return probs

    @staticmethod
    def get_batch_per_block(sq, sk, b, np):
        return batch_per_block(sq, sk, b, np)
