"""Megatron's model-parallel layers, with their signatures, on :mod:`shim.nn.tensor_parallel`.

Megatron's defaults are kept: Xavier-normal weights and zero biases, the whole
weight initialised then split, ``model_parallel = True`` on split parameters.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor, Replicate
from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module
from torch.nn import init

from shim.distributed.layout import ensure_divisible, get_layout
from shim.nn.tensor_parallel import (
    Linear1D,
    VocabParallelEmbedding as _VocabParallelEmbedding,
    _keep_grad_layout,
    _tensor_parallel_mesh,
    strided_order,
)

__all__ = ["ColumnParallelLinear", "ParallelEmbedding", "RowParallelLinear", "VocabParallelEmbedding"]


def _whole(param, dim: int, stride: int, parts: int):
    """The whole weight in natural order, as Megatron's ``keep_master_weight_for_test`` returns it."""
    whole = param.full_tensor() if isinstance(param, DTensor) else param
    return strided_order(whole.detach(), dim, parts, stride) if parts > 1 else whole.detach().clone()


class ColumnParallelLinear(Linear1D):
    """``Y = X A^T + b`` with ``A`` split by output rows; ``gather_output`` all-gathers ``Y``."""

    def __init__(
        self,
        input_size,
        output_size,
        bias=True,
        gather_output=True,
        init_method=init.xavier_normal_,
        stride=1,
        keep_master_weight_for_test=False,
    ):
        super().__init__(
            input_size, output_size, bias, parallel="col", gather_output=gather_output, init_method=init_method,
            stride=stride,
        )
        self.input_size, self.output_size, self.gather_output = input_size, output_size, gather_output
        self.weight.model_parallel = True
        if self.bias is not None:
            self.bias.model_parallel = True
        parts = self.weight.device_mesh.size() if isinstance(self.weight, DTensor) else 1
        self.master_weight = _whole(self.weight, 0, stride, parts) if keep_master_weight_for_test else None


class RowParallelLinear(Linear1D):
    """``Y = X A^T + b`` with ``A`` split by input columns; the partial products are all-reduced."""

    def __init__(
        self,
        input_size,
        output_size,
        bias=True,
        input_is_parallel=False,
        init_method=init.xavier_normal_,
        stride=1,
        keep_master_weight_for_test=False,
    ):
        super().__init__(
            input_size, output_size, bias, parallel="row", input_is_parallel=input_is_parallel,
            init_method=init_method, stride=stride,
        )
        self.input_size, self.output_size, self.input_is_parallel = input_size, output_size, input_is_parallel
        self.weight.model_parallel = True
        parts = self.weight.device_mesh.size() if isinstance(self.weight, DTensor) else 1
        self.master_weight = _whole(self.weight, 1, stride, parts) if keep_master_weight_for_test else None


class VocabParallelEmbedding(_VocabParallelEmbedding):
    """Embedding split over the vocabulary; every rank gets the whole output."""

    def __init__(self, num_embeddings, embedding_dim, init_method=init.xavier_normal_):
        super().__init__(num_embeddings, embedding_dim, init_method=init_method)
        self.weight.model_parallel = True


class ParallelEmbedding(nn.Embedding):
    """Embedding split over the embedding dim; every rank gets the whole (gathered) output."""

    def __init__(self, num_embeddings, embedding_dim, init_method=init.xavier_normal_, keep_master_weight_for_test=False):
        tp_size = get_layout().tensor_parallel_size
        ensure_divisible(embedding_dim, tp_size, "ParallelEmbedding embedding_dim", "tensor_parallel_size")
        super().__init__(num_embeddings, embedding_dim)
        with torch.no_grad():
            init_method(self.weight)
        self.master_weight = self.weight.detach().clone() if keep_master_weight_for_test else None
        if tp_size > 1:
            parallelize_module(
                self, _tensor_parallel_mesh(0), ColwiseParallel(input_layouts=Replicate(), output_layouts=Replicate())
            )
            _keep_grad_layout(self.weight)
        self.weight.model_parallel = True
