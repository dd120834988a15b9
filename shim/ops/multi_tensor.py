"""apex's ``amp_C`` multi-tensor kernels on ``torch._foreach_*``, with apex's calling convention.

Each function takes what apex's ``multi_tensor_applier(op, noop_flag, tensor_lists, *args)`` passes
on: ``(chunk_size, noop_flag, tensor_lists, *args)``. ``chunk_size`` only shaped the CUDA launch and
is ignored. ``noop_flag`` is apex's overflow buffer, a one-element int tensor: the kernels that check
finiteness set it to 1 (never back to 0) and the optimizer kernels that honour it do nothing while it
is 1, exactly where apex's do. Results are written in place into the lists given, in each tensor's own
dtype, with the arithmetic in fp32 as in apex; the norm kernels return apex's ``(total, per_tensor)``
pair (fp32, shapes ``[1]`` and ``[n]``, or ``[0]`` when ``per_tensor`` is false).

The math per kernel is apex's ``csrc/multi_tensor_*.cu``; each docstring states it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ['multi_tensor_scale', 'multi_tensor_axpby', 'multi_tensor_l2norm', 'multi_tensor_l2norm_mp', 'multi_tensor_l2norm_scale', 'multi_tensor_unscale_l2norm', 'multi_tensor_adam', 'multi_tensor_adam_capturable', 'multi_tensor_adam_capturable_master', 'multi_tensor_sgd', 'multi_tensor_adagrad', 'NOT_PROVIDED']

Tensors = Sequence[torch.Tensor]


def _flag_if(noop_flag: torch.Tensor, bad: torch.Tensor) -> None:
    """Set apex's overflow flag to 1 where ``bad`` (a 0-d bool tensor) holds, without a host sync."""
    noop_flag.copy_(torch.where(bad.to(noop_flag.device), torch.ones_like(noop_flag), noop_flag))


def _any_nonfinite(tensors: Tensors) -> torch.Tensor:
    if not tensors:
        return torch.zeros((), dtype=torch.bool)
    # The largest magnitude per tensor (one foreach reduction, no overflow, no copy): inf if an element
    # is inf, nan if one is nan; apex checks isfinite per element.
    peaks = torch._foreach_norm(list(tensors), float("inf"))
    return ~torch.isfinite(torch.stack([p.float() for p in peaks])).all()


def _skipped(noop_flag: torch.Tensor) -> bool:
    return bool(noop_flag.numel()) and bool(noop_flag.reshape(-1)[0].item())


def _fp32(tensors: Tensors) -> list[torch.Tensor]:
    """fp32 views of the tensors (the tensors themselves when already fp32)."""
    return [t if t.dtype == torch.float32 else t.float() for t in tensors]


def _write_back(targets: Tensors, values: Tensors) -> None:
    pairs = [(t, v) for t, v in zip(targets, values) if t is not v]
    if pairs:
        torch._foreach_copy_([t for t, _ in pairs], [v for _, v in pairs])


def multi_tensor_scale(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Sequence[Tensors], scale: float) -> None:
    """``out = in * scale`` for ``tensor_lists = [in, out]``; the flag is set if any ``in`` is inf/nan
    (the output is written all the same, as apex does)."""
    inputs, outputs = tensor_lists[0], tensor_lists[1]
    if not inputs:
        return
    _flag_if(noop_flag, _any_nonfinite(inputs))
    _write_back(outputs, torch._foreach_mul(_fp32(inputs), float(scale)))


def multi_tensor_axpby(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Sequence[Tensors],
                       a: float, b: float, arg_to_check: int) -> None:
    """``out = a * x + b * y`` for ``[x, y, out]``; checks x (``arg_to_check`` 0), y (1) or both (-1)."""
    xs, ys, outs = tensor_lists
    if not xs:
        return
    checked = {0: list(xs), 1: list(ys), -1: list(xs) + list(ys)}.get(int(arg_to_check), [])
    if checked:
        _flag_if(noop_flag, _any_nonfinite(checked))
    result = torch._foreach_mul(_fp32(xs), float(a))
    torch._foreach_add_(result, torch._foreach_mul(_fp32(ys), float(b)))
    _write_back(outs, result)


def _l2norm(noop_flag: torch.Tensor, tensors: Tensors, per_tensor: bool | None, scale_by=None):
    per_tensor = bool(per_tensor)
    if not tensors:
        empty = torch.zeros(0, dtype=torch.float32)
        return torch.zeros(1, dtype=torch.float32), empty
    values = _fp32(tensors)
    if scale_by is not None:
        values = torch._foreach_mul(values, scale_by)
    norms = torch.stack(torch._foreach_norm(values, 2)).to(torch.float32)
    total = norms.square().sum().sqrt().reshape(1)
    _flag_if(noop_flag, ~torch.isfinite(total[0]))
    return total, (norms if per_tensor else torch.zeros(0, dtype=torch.float32, device=total.device))


def multi_tensor_l2norm(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Sequence[Tensors],
                        per_tensor: bool | None = False):
    """``(‖all‖₂ as a [1] fp32 tensor, per-tensor norms [n] or [0])`` of ``tensor_lists[0]``, in fp32;
    the flag is set if the norm is not finite."""
    return _l2norm(noop_flag, tensor_lists[0], per_tensor)


multi_tensor_l2norm_mp = multi_tensor_l2norm  # apex: the same, for a list mixing fp16 and fp32 tensors


def multi_tensor_l2norm_scale(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Sequence[Tensors],
                              scale: float, per_tensor: bool | None = False):
    """For ``[in, out]``: the norms of ``in`` (as :func:`multi_tensor_l2norm`) and ``out = in * scale``."""
    result = _l2norm(noop_flag, tensor_lists[0], per_tensor)
    if tensor_lists[0]:
        _write_back(tensor_lists[1], torch._foreach_mul(_fp32(tensor_lists[0]), float(scale)))
    return result


def multi_tensor_unscale_l2norm(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Sequence[Tensors],
                                inv_scale: torch.Tensor, per_tensor: bool | None = False):
    """The norms of ``tensor_lists[0] * inv_scale`` (the tensors are not changed)."""
    scale = float(inv_scale.reshape(-1)[0].item()) if isinstance(inv_scale, torch.Tensor) else float(inv_scale)
    return _l2norm(noop_flag, tensor_lists[0], per_tensor, scale_by=scale)


def _number(value) -> float:
    return float(value.reshape(-1)[0].item()) if isinstance(value, torch.Tensor) else float(value)


def _adam(tensor_lists, lr, beta1, beta2, eps, step, mode, bias_correction, weight_decay, inv_scale=None):
    grads, params, exp_avgs, exp_avg_sqs = (list(t) for t in tensor_lists[:4])
    if not grads:
        return
    lr, step = _number(lr), _number(step)
    g = _fp32(grads)
    if inv_scale is not None:
        g = torch._foreach_mul(g, _number(inv_scale))
    elif any(x is y for x, y in zip(g, grads)):
        g = [x.clone() for x in g]  # updated below; the caller's grads stay as they are
    p, m, v = _fp32(params), _fp32(exp_avgs), _fp32(exp_avg_sqs)
    if int(mode) == 0 and weight_decay != 0:  # ADAM_MODE_0: L2, the decay goes into the gradient
        torch._foreach_add_(g, p, alpha=float(weight_decay))
    torch._foreach_mul_(m, beta1)
    torch._foreach_add_(m, g, alpha=1 - beta1)
    torch._foreach_mul_(v, beta2)
    torch._foreach_addcmul_(v, g, g, value=1 - beta2)
    c1 = 1 - beta1 ** step if bias_correction else 1.0
    c2 = 1 - beta2 ** step if bias_correction else 1.0
    denom = torch._foreach_div(v, c2)
    torch._foreach_sqrt_(denom)
    torch._foreach_add_(denom, eps)
    update = torch._foreach_div(m, c1)
    torch._foreach_div_(update, denom)
    if int(mode) != 0 and weight_decay != 0:  # ADAM_MODE_1: decoupled (AdamW)
        torch._foreach_add_(update, p, alpha=float(weight_decay))
    torch._foreach_add_(p, update, alpha=-lr)
    _write_back(params, p)
    _write_back(exp_avgs, m)
    _write_back(exp_avg_sqs, v)
    if len(tensor_lists) > 4:  # apex's optional fp16 copy of the parameters
        _write_back(tensor_lists[4], p)


def multi_tensor_adam(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Sequence[Tensors],
                      lr, beta1: float, beta2: float, epsilon: float, step, mode: int,
                      bias_correction: int, weight_decay: float, inv_scale=None) -> None:
    """Adam on ``[grads, params, exp_avg, exp_avg_sq]``. ``mode`` 0 adds ``weight_decay * p`` to the
    gradient (L2), 1 adds it to the update (AdamW). With ``bias_correction``, ``m / (1 - beta1**step)``
    over ``sqrt(v / (1 - beta2**step)) + eps``; ``p -= lr * update``. ``lr``/``step`` may be tensors
    and ``inv_scale`` (apex's newer signature) multiplies the gradients first; then, as apex's
    capturable kernel, nothing happens while the flag is set."""
    if inv_scale is not None and _skipped(noop_flag):
        return
    _adam(tensor_lists, lr, beta1, beta2, epsilon, step, mode, bias_correction, weight_decay, inv_scale)


def multi_tensor_adam_capturable(chunk_size, noop_flag, tensor_lists, lr, beta1, beta2, epsilon, step, mode,
                                 bias_correction, weight_decay, inv_scale) -> None:
    """apex's graph-capturable Adam: the same math, ``lr``/``step`` as tensors, gradients times
    ``inv_scale``, skipped while the flag is set."""
    if _skipped(noop_flag):
        return
    _adam(tensor_lists, lr, beta1, beta2, epsilon, step, mode, bias_correction, weight_decay, inv_scale)


def multi_tensor_adam_capturable_master(chunk_size, noop_flag, tensor_lists, lr, beta1, beta2, epsilon, step,
                                        mode, bias_correction, weight_decay, inv_scale) -> None:
    """As :func:`multi_tensor_adam_capturable` on ``[grads, params, m, v, fp32 master params]``: the
    update is computed on the master copy, which is then written into the (low-precision) params."""
    if _skipped(noop_flag):
        return
    grads, params, m, v, master = tensor_lists
    _adam([grads, master, m, v], lr, beta1, beta2, epsilon, step, mode, bias_correction, weight_decay, inv_scale)
    _write_back(params, list(master))


def multi_tensor_sgd(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Sequence[Tensors], wd: float,
                     momentum: float, dampening: float, lr: float, nesterov: bool, first_run: bool,
                     wd_after_momentum: bool, scale: float) -> None:
    """SGD on ``[grads, params, momentum_buffers]`` (and a 4th list: fp16 copies of the params written
    after the step). ``g = grad * scale`` (+ ``wd * p`` before momentum unless ``wd_after_momentum``);
    momentum: ``buf = g`` on the first run else ``buf * momentum + (1 - dampening) * g``, then
    ``g = g + momentum * buf`` (nesterov) or ``buf``; ``p -= lr * g``. Skipped while the flag is set."""
    if _skipped(noop_flag):
        return
    grads, params, moms = (list(t) for t in tensor_lists[:3])
    if not grads:
        return
    g = torch._foreach_mul(_fp32(grads), float(scale))
    p = _fp32(params)
    if wd != 0 and not wd_after_momentum:
        torch._foreach_add_(g, p, alpha=float(wd))
    if momentum != 0:
        buf = _fp32(moms)
        if first_run:
            torch._foreach_copy_(buf, g)
        else:
            torch._foreach_mul_(buf, float(momentum))
            torch._foreach_add_(buf, g, alpha=1 - float(dampening))
        if nesterov:
            torch._foreach_add_(g, buf, alpha=float(momentum))
        else:
            g = [b.clone() for b in buf]
        _write_back(moms, buf)
    if wd != 0 and wd_after_momentum:
        torch._foreach_add_(g, p, alpha=float(wd))
    torch._foreach_add_(p, g, alpha=-float(lr))
    _write_back(params, p)
    if len(tensor_lists) > 3:
        _write_back(tensor_lists[3], p)


def multi_tensor_adagrad(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: Sequence[Tensors], lr: float,
                         epsilon: float, mode: int, weight_decay: float) -> None:
    """Adagrad on ``[grads, params, state_sums]``: mode 0 adds ``wd * p`` to the gradient, then
    ``h += g*g`` and ``p -= lr * g / (sqrt(h) + eps)``; mode 1 adds ``wd * p`` to that update instead."""
    grads, params, sums = (list(t) for t in tensor_lists)
    if not grads:
        return
    g = [x.clone() if x.dtype == torch.float32 else x.float() for x in grads]
    p, h = _fp32(params), _fp32(sums)
    if int(mode) == 0 and weight_decay != 0:
        torch._foreach_add_(g, p, alpha=float(weight_decay))
    torch._foreach_addcmul_(h, g, g)
    denom = torch._foreach_sqrt(h)
    torch._foreach_add_(denom, float(epsilon))
    update = torch._foreach_div(g, denom)
    if int(mode) != 0 and weight_decay != 0:
        torch._foreach_add_(update, p, alpha=float(weight_decay))
    torch._foreach_add_(p, update, alpha=-float(lr))
    _write_back(params, p)
    _write_back(sums, h)


# Kernels apex's Python code also calls that have no equivalent here (see docs/ops.md): their
# names stay unresolved so `amp_C.<name>` fails with the reason rather than doing something else.
NOT_PROVIDED = {
    "multi_tensor_lamb": "FusedLAMB's kernel (trust-ratio per tensor, global grad-norm clipping)",
    "multi_tensor_lamb_mp": "FusedMixedPrecisionLamb's kernel",
    "multi_tensor_lamb_stage1_cuda": "the two-stage LAMB of apex.contrib",
    "multi_tensor_lamb_stage2_cuda": "the two-stage LAMB of apex.contrib",
    "multi_tensor_novograd": "FusedNovoGrad's kernel",
}
