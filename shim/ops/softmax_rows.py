"""The two kernel steps of softmax cross entropy, shared by both cross-entropy ops.

:mod:`shim.ops.cross_entropy` (one process) and :mod:`shim.ops.vocab_parallel_cross_entropy`
(vocab-sharded logits) both compute a per-row logsumexp in forward and write
``softmax - onehot`` into one logits-sized buffer in backward; these are those two steps.
On CPU each widens one block of rows to fp32 at a time, so no fp32 copy of the whole
logits exists; on CUDA each is one ``torch.compile``d kernel.
"""

from __future__ import annotations

import torch

from shim.ops._cuda import compiled_on_first_use

__all__ = ["logsumexp_rows", "softmax_minus_onehot_scaled", "work_dtype"]

# Elements per CPU block of the fp16/bf16 path (16 MiB once widened, inside L3). Smaller
# blocks mean more parallel regions, which cost dearly when other processes share the cores.
_BLOCK_ELEMENTS = 1 << 22



def work_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the math runs in: fp32 for fp32/fp16/bf16, fp64 for fp64."""
    return torch.promote_types(dtype, torch.float32)


def _rows_per_block(vocab: int) -> int:
    return max(1, _BLOCK_ELEMENTS // vocab)


def logsumexp_rows(logits_2d, at=None):
    """Per-row logsumexp, in fp32 or wider; on CPU one block of rows widened at a time.

    On CPU it is ``x[j] - log_softmax(x)[j]`` for a column ``j`` per row: one log-softmax
    kernel per block costs a third of ``torch.logsumexp`` (an ATen composite of five
    passes). ``j`` is ``at`` (the labels: the loss needs ``log_softmax(x)[label]`` anyway,
    and the rounding is that of the loss) or else the row's argmax, where the log-softmax
    is near 0 and nothing cancels.
    """
    if logits_2d.is_cuda:
        return _logsumexp_cuda(logits_2d)
    work = work_dtype(logits_2d.dtype)
    lse = torch.empty(logits_2d.shape[0], dtype=work, device=logits_2d.device)
    step = _rows_per_block(logits_2d.shape[1])
    for start in range(0, logits_2d.shape[0], step):
        rows = slice(start, start + step)
        block = logits_2d[rows].to(work)
        column = block.argmax(dim=1, keepdim=True) if at is None else at[rows, None]
        log_probs = torch.log_softmax(block, dim=1)
        torch.sub(block.gather(1, column).squeeze(1), log_probs.gather(1, column).squeeze(1), out=lse[rows])
    return lse


def softmax_minus_onehot_scaled(logits_2d, labels_1d, lse, grad_loss_1d):
    """``(exp(logits - lse) - onehot(labels)) * grad_loss`` in the logits' dtype, one logits-sized buffer."""
    if logits_2d.is_cuda:
        return _softmax_grad_cuda(logits_2d, labels_1d, lse, grad_loss_1d)
    grad = torch.empty_like(logits_2d, memory_format=torch.contiguous_format)
    step = _rows_per_block(logits_2d.shape[1])
    for start in range(0, logits_2d.shape[0], step):
        rows = slice(start, start + step)
        # widen first: a mixed-dtype subtraction takes ATen's slow path
        block = logits_2d[rows].to(lse.dtype, copy=True)
        block.sub_(lse[rows, None]).exp_().mul_(grad_loss_1d[rows, None])
        block.scatter_add_(1, labels_1d[rows, None], grad_loss_1d[rows, None].neg())
        grad[rows].copy_(block)
    return grad


@compiled_on_first_use
def _logsumexp_cuda(logits_2d):
    return torch.logsumexp(logits_2d.to(work_dtype(logits_2d.dtype)), dim=1)


@compiled_on_first_use
def _softmax_grad_cuda(logits_2d, labels_1d, lse, grad_loss_1d):
    vocab_ids = torch.arange(logits_2d.shape[1], device=logits_2d.device)
    onehot = (vocab_ids[None, :] == labels_1d[:, None]).to(lse.dtype)
    probs = torch.exp(logits_2d.to(lse.dtype) - lse[:, None])
    return ((probs - onehot) * grad_loss_1d[:, None]).to(logits_2d.dtype)
