"""Sparse softmax cross entropy (OneFlow's ``sparse_softmax_cross_entropy``).

``loss[i] = logsumexp(logits[i]) - logits[i, labels[i]]`` for every position ``i``, with
the gradient ``(softmax(logits[i]) - onehot(labels[i])) * grad_loss[i]``.

The composed formula (max, subtract, exp, sum, log, gather) keeps about three fp32
copies of the logits alive across forward and backward. Here the forward saves only the
logits it was given and one logsumexp per row; the backward writes the softmax, the
one-hot correction and the output-gradient scaling into the gradient buffer itself, so
it allocates that one logits-sized tensor and nothing else of that size. On CPU the rows
are processed in cache-sized blocks (each block is read once per pass while it is still
in cache), and half/bfloat16 logits are widened to fp32 one block at a time.
"""

from __future__ import annotations

import sys

import torch
from torch.autograd.function import once_differentiable

from shim.ops._cuda import compiled_on_first_use

# Elements per CPU block: 4 MiB of fp32 stays in L3 while several passes run over it.
# Measured (bench/cross_entropy.py, V=50304): 1 row/block loses to thread start-up
# costs, whole-tensor passes lose to memory bandwidth; ~20 rows sits between.
_BLOCK_ELEMENTS = 1 << 20


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
        return _vocab_parallel(local_logits, local_labels, group)
    if process_group is not None and process_group.size() > 1:
        _check_inputs(logits, labels, check_range=False)
        return _vocab_parallel(logits, labels, process_group)
    _check_inputs(logits, labels, check_range=True)
    return _SparseSoftmaxCrossEntropy.apply(logits, labels)


def _vocab_parallel(local_logits, labels, group):
    from shim.ops.vocab_parallel_cross_entropy import vocab_parallel_sparse_softmax_cross_entropy

    return vocab_parallel_sparse_softmax_cross_entropy(local_logits, labels, group)


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


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.promote_types(dtype, torch.float32)


class _SparseSoftmaxCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, labels):
        vocab = logits.shape[-1]
        logits_2d = logits.reshape(-1, vocab)
        labels_1d = labels.reshape(-1).long()
        lse = _logsumexp_rows(logits_2d)
        target = logits_2d.gather(1, labels_1d[:, None]).squeeze(1)
        ctx.save_for_backward(logits_2d, labels_1d, lse)
        ctx.logits_shape = logits.shape
        return (lse - target.to(lse.dtype)).view(labels.shape)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss):
        logits_2d, labels_1d, lse = ctx.saved_tensors
        grad_loss_1d = grad_loss.reshape(-1).to(lse.dtype)
        grad_logits = _softmax_minus_onehot_scaled(logits_2d, labels_1d, lse, grad_loss_1d)
        return grad_logits.view(ctx.logits_shape), None


def _rows_per_block(vocab: int) -> int:
    return max(1, _BLOCK_ELEMENTS // vocab)


def _logsumexp_rows(logits_2d):
    if logits_2d.is_cuda:
        return _logsumexp_cuda(logits_2d)
    work = _work_dtype(logits_2d.dtype)
    lse = torch.empty(logits_2d.shape[0], dtype=work, device=logits_2d.device)
    step = _rows_per_block(logits_2d.shape[1])
    for start in range(0, logits_2d.shape[0], step):
        block = logits_2d[start : start + step]
        torch.logsumexp(block.to(work), dim=1, out=lse[start : start + step])
    return lse


def _softmax_minus_onehot_scaled(logits_2d, labels_1d, lse, grad_loss_1d):
    """``(exp(logits - lse) - onehot(labels)) * grad_loss``, in one logits-sized buffer."""
    if logits_2d.is_cuda:
        return _softmax_grad_cuda(logits_2d, labels_1d, lse, grad_loss_1d)
    grad = torch.empty_like(logits_2d, memory_format=torch.contiguous_format)
    widen = grad.dtype != lse.dtype
    step = _rows_per_block(logits_2d.shape[1])
    scratch = torch.empty((step, logits_2d.shape[1]), dtype=lse.dtype) if widen else None
    for start in range(0, logits_2d.shape[0], step):
        rows = slice(start, start + step)
        out = scratch[: grad[rows].shape[0]] if widen else grad[rows]
        torch.sub(logits_2d[rows], lse[rows, None], out=out)
        out.exp_()
        out.mul_(grad_loss_1d[rows, None])
        out.scatter_add_(1, labels_1d[rows, None], grad_loss_1d[rows, None].neg())
        if widen:
            grad[rows].copy_(out)
    return grad


@compiled_on_first_use
def _logsumexp_cuda(logits_2d):
    return torch.logsumexp(logits_2d.to(_work_dtype(logits_2d.dtype)), dim=1)


@compiled_on_first_use
def _softmax_grad_cuda(logits_2d, labels_1d, lse, grad_loss_1d):
    vocab_ids = torch.arange(logits_2d.shape[1], device=logits_2d.device)
    onehot = (vocab_ids[None, :] == labels_1d[:, None]).to(lse.dtype)
    probs = torch.exp(logits_2d.to(lse.dtype) - lse[:, None])
    return ((probs - onehot) * grad_loss_1d[:, None]).to(logits_2d.dtype)
