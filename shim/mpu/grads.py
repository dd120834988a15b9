"""Megatron's ``clip_grad_norm`` for a model whose split parameters are DTensors."""

from __future__ import annotations

import math

import torch
from torch.distributed.tensor import DTensor
from torch.nn.utils import get_total_norm

from shim.distributed.collectives import all_reduce
from shim.mpu.initialize import get_model_parallel_group

__all__ = ["clip_grad_norm"]


def _is_split(param) -> bool:
    # A DTensor with a Shard placement, or a Megatron-style local shard marked model_parallel.
    if isinstance(param, DTensor):
        return any(p.is_shard() for p in param.placements)
    return bool(getattr(param, "model_parallel", False))


def _counted_rows(grad, param) -> list:
    # A split parameter may also hold rows another rank holds (``Linear1D(section_replicas=)``): that rank
    # counts them, this one leaves out the ranges ``tensor_parallel_duplicate_rows`` lists.
    duplicates = getattr(param, "tensor_parallel_duplicate_rows", None)
    if not duplicates:
        return [grad]
    kept, start = [], 0
    for begin, end in sorted(duplicates):
        kept.append(grad[start:begin])
        start = end
    kept.append(grad[start:])
    return [g for g in kept if g.numel()]


def clip_grad_norm(parameters, max_norm: float, norm_type: float = 2) -> float:
    """Scale gradients in place so their global norm is at most ``max_norm``; return that norm.

    Split parameters' gradients add up across the model-parallel group; replicated
    ones count once, and so do rows of a split parameter that several ranks hold
    (``tensor_parallel_duplicate_rows``). ``norm_type`` may be ``inf``.
    """
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    params = [p for p in parameters if p.grad is not None]
    if not params:
        return 0.0
    norm_type = float(norm_type)
    local = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in params]
    split = [piece for g, p in zip(local, params) if _is_split(p) for piece in _counted_rows(g, p)]
    replicated = [g for g, p in zip(local, params) if not _is_split(p)]
    # Local norms by torch's own (foreach) reduction, combined across ranks as norm**p sums (or maxima).
    norms = torch.stack([get_total_norm(gs, norm_type).float() if gs else local[0].new_zeros((), dtype=torch.float32)
                         for gs in (split, replicated)])
    if math.isinf(norm_type):
        all_reduce(norms[0], op=torch.distributed.ReduceOp.MAX, group=get_model_parallel_group())
        total_norm = norms.max().item()
    else:
        powered = norms**norm_type
        all_reduce(powered[:1], group=get_model_parallel_group())
        total_norm = powered.sum().item() ** (1.0 / norm_type)
    clip_coef = max_norm / (total_norm + 1e-6)
    if clip_coef < 1:
        torch._foreach_mul_(local, clip_coef)
    return total_norm
