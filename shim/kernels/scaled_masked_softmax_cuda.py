"""Megatron's ``scaled_masked_softmax_cuda`` extension (padding-masked softmax), on :mod:`shim.ops.softmax`."""

from shim.ops.softmax import batch_per_block, scaled_masked_softmax_forward, scaled_softmax_backward

__all__ = ['forward', 'backward', 'get_batch_per_block']


def forward(inputs, mask, scale):
    """``softmax(inputs * scale)`` with positions where ``mask`` is 1 set to -10000; fp32 math, inputs' dtype."""
    return scaled_masked_softmax_forward(inputs, mask, float(scale))


def backward(output_grads, softmax_results, scale):
    return scaled_softmax_backward(output_grads, softmax_results, float(scale))


def get_batch_per_block(query_seq_len, key_seq_len, batches, attn_heads):
    return batch_per_block(query_seq_len, key_seq_len, batches, attn_heads)
