"""Megatron's ``scaled_upper_triang_masked_softmax_cuda`` extension (causal softmax), on :mod:`shim.ops.softmax`."""

from shim.ops.softmax import scaled_softmax_backward, scaled_upper_triang_masked_softmax_forward

__all__ = ['forward', 'backward']


def forward(inputs, scale):
    """Causal ``softmax(inputs * scale)`` over ``[batches, sq, sq]``; masked entries are exactly 0."""
    return scaled_upper_triang_masked_softmax_forward(inputs, float(scale))


def backward(output_grads, softmax_results, scale):
    return scaled_softmax_backward(output_grads, softmax_results, float(scale))
