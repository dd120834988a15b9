"""Megatron's ``vocab_parallel_cross_entropy`` over the model-parallel group."""

from __future__ import annotations

from shim.mpu.initialize import get_model_parallel_group
from shim.ops.vocab_parallel_cross_entropy import vocab_parallel_sparse_softmax_cross_entropy

__all__ = ["vocab_parallel_cross_entropy"]


def vocab_parallel_cross_entropy(vocab_parallel_logits, target):
    """Per-position loss of this rank's vocab slice of the logits against global ``target`` ids.

    The math is fp32 whatever the logits' dtype, so callers need not ``.float()`` them first.
    """
    return vocab_parallel_sparse_softmax_cross_entropy(vocab_parallel_logits, target, get_model_parallel_group())
