"""apex's ``fused_dense`` (``FusedDense``, ``FusedDenseGeluDense``, ``fused_dense_function``): a GEMM with
its bias add (and a GELU between two), which ``torch.nn.Linear`` / ``F.linear`` already fuse (addmm).

Parameter names follow apex: ``FusedDense`` has ``weight`` / ``bias`` like Linear; ``FusedDenseGeluDense``
has ``weight1``, ``bias1``, ``weight2``, ``bias2``. apex's GELU here is the erf form (``F.gelu``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

__all__ = ['fused_dense_function', 'fused_dense_gelu_dense_function', 'FusedDense', 'FusedDenseGeluDense']


def fused_dense_function(input, weight, bias):
    return F.linear(input, weight, bias)


def fused_dense_gelu_dense_function(input, weight1, bias1, weight2, bias2):
    return F.linear(F.gelu(F.linear(input, weight1, bias1)), weight2, bias2)


class FusedDense(torch.nn.Linear):
    def __init__(self, in_features, out_features, bias=True):
        super().__init__(in_features, out_features, bias=bias)


class FusedDenseGeluDense(torch.nn.Module):
    def __init__(self, in_features, intermediate_features, out_features, bias=True):
        super().__init__()
        if not bias:
            raise ValueError("FusedDenseGeluDense: apex supports bias=True only")
        self.in_features, self.intermediate_features, self.out_features = in_features, intermediate_features, out_features
        self.weight1 = torch.nn.Parameter(torch.empty(intermediate_features, in_features))
        self.bias1 = torch.nn.Parameter(torch.empty(intermediate_features))
        self.weight2 = torch.nn.Parameter(torch.empty(out_features, intermediate_features))
        self.bias2 = torch.nn.Parameter(torch.empty(out_features))
        self.reset_parameters()

    def reset_parameters(self):
        for weight, bias in ((self.weight1, self.bias1), (self.weight2, self.bias2)):  # as torch.nn.Linear
            torch.nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
            bound = 1 / math.sqrt(weight.shape[1])
            torch.nn.init.uniform_(bias, -bound, bound)

    def forward(self, input):
        return fused_dense_gelu_dense_function(input, self.weight1, self.bias1, self.weight2, self.bias2)
