"""Megatron's ``scaled_softmax_cuda`` extension (softmax of scaled scores, no mask), on :mod:`shim.ops.softmax`."""

import torch

from shim.ops.softmax import scaled_softmax_backward

__all__ = ['forward', 'backward']


def forward(inputs, scale):
    return torch.softmax(inputs.float() * float(scale), dim=-1).to(inputs.dtype)


def backward(output_grads, softmax_results, scale):
    return scaled_softmax_backward(output_grads, softmax_results, float(scale))
