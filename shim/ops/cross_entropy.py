"""Sparse softmax cross entropy (OneFlow's ``sparse_softmax_cross_entropy``).

``loss[i] = logsumexp(logits[i]) - logits[i, labels[i]]`` for every position ``i``, with
the gradient ``(softmax(logits[i]) - onehot(labels[i])) * grad_loss[i]``.

The composed formula (max, subtract, exp, sum, log, gather) keeps about three fp32
copies of the logits alive across forward and backward. Here each path allocates ONE
logits-sized buffer, and that buffer becomes the gradient:

- fp32 on CPU: ``log_softmax`` (one row-parallel ATen kernel) is saved, and backward
  exponentiates and scales it in place.
- fp16/bf16 (and fp64) on CPU: the logits and an fp32 logsumexp per row are saved; backward
  widens blocks of rows to fp32 one at a time, so no fp32 copy of the whole logits exists.
- CUDA: as fp16/bf16, with the block loop replaced by a ``torch.compile``d kernel.

The two kernel steps live in :mod:`shim.ops.softmax_rows`; the vocab-parallel op
(:mod:`shim.ops.vocab_parallel_cross_entropy`) shares them, and this module hands sharded
logits to it (it never imports this module back).
"""

from __future__ import annotations

import sys

import torch
from torch.autograd.function import once_differentiable

from shim.ops.softmax_rows import logsumexp_rows, softmax_minus_onehot_scaled
from shim.ops.vocab_parallel_cross_entropy import vocab_parallel_sparse_softmax_cross_entropy

__all__ = ["sparse_softmax_cross_entropy"]


def sparse_softmax_cross_entropy(logits, labels, *, process_group=None):
    """Per-position cross entropy of ``logits [..., V]`` against integer ``labels [...]``.

    Returns a tensor of ``labels``' shape, in fp32 for fp32/fp16/bf16 logits (fp64 for
    fp64); the math runs in fp32 whatever the logits' precision. The gradient has the
    logits' dtype. Every label must lie in ``[0, V)``: there is no ignore index (mask the
    loss instead, as GLM does with ``sum(loss * loss_mask) / loss_mask.sum()``).

    With ``process_group`` of size > 1, ``logits`` is this rank's contiguous vocab shard
    and ``labels`` are global ids; a DTensor sharded on its last dim works the same way
    with its own mesh's group. Both delegate to
    :func:`shim.ops.vocab_parallel_cross_entropy.vocab_parallel_sparse_softmax_cross_entropy`.
    """
    vocab_sharded = _vocab_shard_of(logits)
    if vocab_sharded is not None:
        local_logits, group = vocab_sharded
        local_labels = labels.to_local() if _is_dtensor(labels) else labels
        _check_inputs(local_logits, local_labels, check_range=False)
        return vocab_parallel_sparse_softmax_cross_entropy(local_logits, local_labels, group)
    if process_group is not None and process_group.size() > 1:
        _check_inputs(logits, labels, check_range=False)
        return vocab_parallel_sparse_softmax_cross_entropy(logits, labels, process_group)
    _check_inputs(logits, labels, check_range=True)
    return _cross_entropy(logits, labels)


def _is_dtensor(tensor) -> bool:
    # A DTensor can only exist once torch.distributed.tensor is imported; don't import it here.
    dtensor_module = sys.modules.get("torch.distributed.tensor")
    return dtensor_module is not None and isinstance(tensor, dtensor_module.DTensor)


def _vocab_shard_of(logits):
    """``(local_logits, group)`` for a DTensor sharded on its last dim, else None."""
    if not _is_dtensor(logits):
        return None
    last = logits.ndim - 1
    for mesh_dim, placement in enumerate(logits.placements):
        if placement.is_shard() and placement.dim % logits.ndim == last:
            return logits.to_local(), logits.device_mesh.get_group(mesh_dim)
    raise ValueError(
        "sparse_softmax_cross_entropy: DTensor logits must be sharded on the vocab (last) dim, "
        f"got placements {tuple(logits.placements)}; pass a local tensor instead"
    )


def _check_inputs(logits, labels, *, check_range: bool) -> None:
    where = "sparse_softmax_cross_entropy"
    if not isinstance(logits, torch.Tensor) or not isinstance(labels, torch.Tensor):
        raise TypeError(f"{where}: logits and labels must be tensors")
    if not logits.is_floating_point():
        raise TypeError(f"{where}: logits must be floating point, got {logits.dtype}")
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise TypeError(f"{where}: labels must be an integer tensor, got {labels.dtype}")
    if logits.ndim == 0 or logits.shape[-1] == 0:
        raise ValueError(f"{where}: logits must have a non-empty last (vocab) dim, got shape {tuple(logits.shape)}")
    if labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"{where}: labels shape {tuple(labels.shape)} must equal logits shape without its "
            f"vocab dim, {tuple(logits.shape[:-1])}"
        )
    if logits.device != labels.device:
        raise ValueError(f"{where}: logits on {logits.device} but labels on {labels.device}")
    # On CUDA this check would synchronise every step; gather's device assert covers it there.
    if check_range and labels.numel() and labels.device.type == "cpu":
        vocab = logits.shape[-1]
        low, high = labels.min().item(), labels.max().item()
        if low < 0 or high >= vocab:
            bad = low if low < 0 else high
            raise ValueError(f"{where}: label {bad} out of range for vocab size {vocab} (labels must be in [0, {vocab}))")


def _cross_entropy(logits, labels):
    vocab = logits.shape[-1]
    logits_2d = logits.reshape(-1, vocab)
    labels_1d = labels.reshape(-1).long()
    # fp64 is for checking numerics, so it takes the path that can be backpropagated twice.
    if logits.device.type == "cpu" and logits.dtype == torch.float32:
        loss = _LogSoftmaxCrossEntropy.apply(logits_2d, labels_1d)
    else:
        loss = _RecomputeCrossEntropy.apply(logits_2d, labels_1d)
    return loss.view(labels.shape)


class _LogSoftmaxCrossEntropy(torch.autograd.Function):
    """fp32 on CPU: keep the log-softmax, and turn it into the gradient in place.

    Forward is one row-parallel ATen kernel (each row stays in cache while it is reduced
    and written); backward is two passes over the one logits-sized buffer, the saved
    log-softmax, exponentiated and scaled where it lies. Like upstream's mpu version, the
    graph can be backpropagated once: a second pass (``retain_graph=True``) is refused by
    autograd's in-place check, not computed wrong. Few, large kernels also matter here:
    each parallel region waits for every thread, which is slow on shared cores.
    """

    @staticmethod
    def forward(ctx, logits_2d, labels_1d):
        log_probs = torch.log_softmax(logits_2d, dim=1)
        ctx.save_for_backward(log_probs, labels_1d)
        return log_probs.gather(1, labels_1d[:, None]).squeeze(1).neg()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss):
        log_probs, labels_1d = ctx.saved_tensors
        grad_loss = grad_loss.to(log_probs.dtype)[:, None]
        grad = log_probs.exp_().mul_(grad_loss)
        return grad.scatter_add_(1, labels_1d[:, None], grad_loss.neg()), None


class _RecomputeCrossEntropy(torch.autograd.Function):
    """fp16/bf16/fp64 on CPU, and CUDA: keep the logits and one logsumexp per row (fp32 or wider).

    Backward recomputes the softmax from them straight into the gradient (of the logits'
    dtype). On CPU, rows go in blocks widened to fp32 one at a time, so no fp32 copy of the
    whole logits exists; on CUDA one compiled kernel does it.
    """

    @staticmethod
    def forward(ctx, logits_2d, labels_1d):
        lse = logsumexp_rows(logits_2d, at=labels_1d)
        ctx.save_for_backward(logits_2d, labels_1d, lse)
        return lse - logits_2d.gather(1, labels_1d[:, None]).squeeze(1).to(lse.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss):
        logits_2d, labels_1d, lse = ctx.saved_tensors
        grad = softmax_minus_onehot_scaled(logits_2d, labels_1d, lse, grad_loss.to(lse.dtype))
        return grad, None
