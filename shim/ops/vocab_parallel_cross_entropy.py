"""Sparse softmax cross entropy over vocab-sharded logits (Megatron's ``vocab_parallel_cross_entropy``).

Rank ``r`` of ``process_group`` holds the contiguous vocab slice
``[r * V_local, (r + 1) * V_local)`` of the logits; labels are global ids. Per
position::

    lse    = log sum_r exp(lse_r)          lse_r: logsumexp of rank r's slice
    loss   = lse - logits[label]           the label's logit lives on one rank

Two all-reduces: the max of the ``lse_r`` (for a stable sum), then one sum of
``[exp(lse_r - max), target logit or 0]`` stacked. The forward keeps the local
logits it was given and one ``lse`` per position; the backward writes
``softmax - onehot`` into one logits-sized buffer, with the kernels of the
single-process :mod:`shim.ops.cross_entropy` (:mod:`shim.ops.softmax_rows`). Math is fp32
for half/bf16 logits.

Like every op, this module imports only torch and lower ops: the collectives are
``torch.distributed``'s own, on the ``process_group`` the caller passes (a group of one
needs none, so shim's ``SingleProcessGroup`` works too).
"""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from shim.ops.softmax_rows import logsumexp_rows, softmax_minus_onehot_scaled

__all__ = ["vocab_parallel_sparse_softmax_cross_entropy"]


def vocab_parallel_sparse_softmax_cross_entropy(local_logits, labels, process_group=None):
    """Per-position loss (``labels``' shape) of vocab-sharded ``local_logits [..., V/p]``.

    ``process_group``: the ranks the vocab is split over (default: the whole world).
    """
    if process_group is None:
        process_group = torch.distributed.group.WORLD
    return _VocabParallelCrossEntropy.apply(local_logits, labels, process_group)


class _VocabParallelCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, local_logits, labels, group):
        local_vocab = local_logits.shape[-1]
        logits_2d = local_logits.reshape(-1, local_vocab)
        vocab_start = group.rank() * local_vocab
        global_labels = labels.reshape(-1).long()
        _check_label_range(global_labels, local_vocab * group.size())
        local_labels = global_labels - vocab_start
        here = (local_labels >= 0) & (local_labels < local_vocab)
        local_labels = local_labels.where(here, 0)

        local_lse = logsumexp_rows(logits_2d)
        global_max = local_lse.clone()
        _all_reduce(global_max, torch.distributed.ReduceOp.MAX, group)
        target = logits_2d.gather(1, local_labels[:, None]).squeeze(1).to(local_lse.dtype)
        sums = torch.stack([(local_lse - global_max).exp(), target.where(here, 0.0)])
        _all_reduce(sums, torch.distributed.ReduceOp.SUM, group)
        lse = global_max + sums[0].log()

        ctx.save_for_backward(logits_2d, local_labels, here, lse)
        ctx.logits_shape = local_logits.shape
        return (lse - sums[1]).view(labels.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss):
        logits_2d, local_labels, here, lse = ctx.saved_tensors
        grad_loss_1d = grad_loss.reshape(-1).to(lse.dtype)
        # the kernel subtracts grad_loss at every row's label; rows whose label
        # lives on another rank point at column 0 and get it added back.
        grad = softmax_minus_onehot_scaled(logits_2d, local_labels, lse, grad_loss_1d)
        elsewhere = (~here).nonzero().squeeze(1)
        grad[elsewhere, 0] += grad_loss_1d[elsewhere].to(grad.dtype)
        return grad.view(ctx.logits_shape), None, None


def _all_reduce(tensor, op, group) -> None:
    if group.size() > 1:
        torch.distributed.all_reduce(tensor, op=op, group=group)


def _check_label_range(labels, vocab: int) -> None:
    # On CUDA this check would synchronise every step; CPU runs are where bad data shows up first.
    if labels.numel() and labels.device.type == "cpu":
        low, high = labels.min().item(), labels.max().item()
        if low < 0 or high >= vocab:
            bad = low if low < 0 else high
            raise ValueError(
                f"vocab_parallel_sparse_softmax_cross_entropy: label {bad} out of range for vocab size {vocab}"
            )
