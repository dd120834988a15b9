"""Megatron's size helpers."""

from __future__ import annotations

import torch

__all__ = ["VocabUtility", "divide", "ensure_divisibility", "split_tensor_along_last_dim"]


def ensure_divisibility(numerator: int, denominator: int) -> None:
    if denominator <= 0 or numerator % denominator:
        raise ValueError(f"{numerator} is not divisible by {denominator}")


def divide(numerator: int, denominator: int) -> int:
    """``numerator // denominator``, which must be exact."""
    ensure_divisibility(numerator, denominator)
    return numerator // denominator


def split_tensor_along_last_dim(tensor: torch.Tensor, num_partitions: int, contiguous_split_chunks: bool = False):
    """``num_partitions`` equal views along the last dim (contiguous copies if asked)."""
    chunks = torch.split(tensor, divide(tensor.shape[-1], num_partitions), dim=-1)
    return tuple(chunk.contiguous() for chunk in chunks) if contiguous_split_chunks else chunks


class VocabUtility:
    """The ``[first, last)`` vocab ids a model-parallel rank holds."""

    @staticmethod
    def vocab_range_from_per_partition_vocab_size(per_partition_vocab_size: int, rank: int, world_size: int):
        first = rank * per_partition_vocab_size
        return first, first + per_partition_vocab_size

    @staticmethod
    def vocab_range_from_global_vocab_size(global_vocab_size: int, rank: int, world_size: int):
        return VocabUtility.vocab_range_from_per_partition_vocab_size(
            divide(global_vocab_size, world_size), rank, world_size
        )
