"""apex / DeepSpeed optimizers with their signatures and numerics, on torch's fused and foreach kernels.

- ``FusedAdam`` (apex.optimizers): ``adam_w_mode=True`` (the default) is ``torch.optim.AdamW`` math,
  decoupled weight decay; ``False`` is L2 ``torch.optim.Adam``. ``weight_decay`` defaults to 0 as in
  apex, not to AdamW's 0.01. Groups with ``bias_correction=False`` have no torch kernel and take a
  foreach path of their own (``_uncorrected_adam``).
- ``FusedSGD`` (apex.optimizers): ``torch.optim.SGD``; ``wd_after_momentum=True`` is decay applied to
  the weights after the momentum update, i.e. decoupled decay.
- ``DeepSpeedCPUAdam`` (deepspeed.ops.adam): ``FusedAdam`` spelled with DeepSpeed's argument names.

All keep apex's ``zero_grad`` default (``set_grad_none``) and torch's state-dict layout, so
checkpoints load into ``torch.optim.AdamW`` / ``SGD`` and back.
"""

from __future__ import annotations

import contextlib

import torch

__all__ = ["DeepSpeedCPUAdam", "FusedAdam", "FusedSGD"]


def _listed(params) -> list:
    """``params`` as a list, each group's own ``params`` too (they may be one-shot generators)."""
    params = list(params)
    for i, group in enumerate(params):
        if isinstance(group, dict) and not isinstance(group["params"], torch.Tensor):
            params[i] = {**group, "params": list(group["params"])}
    return params


def _fused_default(params: list) -> bool | None:
    """``fused=True`` when torch has a fused kernel for every parameter, else torch's own choice."""
    groups = [p["params"] if isinstance(p, dict) else [p] for p in params]
    tensors = [t for g in groups for t in ([g] if isinstance(g, torch.Tensor) else g)]
    tensors = [t[1] if isinstance(t, tuple) else t for t in tensors]  # (name, tensor) pairs
    fused_devices = torch.utils._foreach_utils._get_fused_kernels_supported_devices()
    if tensors and all(t.is_floating_point() and t.device.type in fused_devices for t in tensors):
        return True
    return None


@contextlib.contextmanager
def _only_groups(optimizer: torch.optim.Optimizer, groups: list[dict]):
    """Let the torch base class step over ``groups`` alone (the others are updated elsewhere)."""
    every_group = optimizer.param_groups
    optimizer.param_groups = groups
    try:
        yield
    finally:
        optimizer.param_groups = every_group


def _base_step(base: type, optimizer: torch.optim.Optimizer) -> None:
    """``base.step`` for ``optimizer``, without the step-hook runner torch wraps around ``base.step``
    once any plain ``base`` instance exists: our own ``step`` already ran the hooks."""
    step = base.step
    if getattr(step, "hooked", False):
        step = step.__wrapped__
    step(optimizer)


class _ApexOptimizer:
    """What apex's optimizers add to torch's: ``set_grad_none`` as ``zero_grad``'s default, and
    constructor options that survive ``copy.deepcopy`` / pickling (torch's ``__getstate__`` keeps
    only defaults, state and param_groups)."""

    _options: tuple[str, ...] = ("set_grad_none",)

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        super().zero_grad(self.set_grad_none if set_to_none is None else set_to_none)

    def __getstate__(self) -> dict:
        return {**super().__getstate__(), **{name: getattr(self, name) for name in self._options}}


class FusedAdam(_ApexOptimizer, torch.optim.Adam):
    """apex's ``FusedAdam``: AdamW math by default (``adam_w_mode=True``), ``weight_decay`` default 0."""

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        adam_w_mode: bool = True,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        set_grad_none: bool = True,
    ):
        if amsgrad:
            raise RuntimeError("FusedAdam does not support the AMSGrad variant.")
        params = _listed(params)
        super().__init__(
            params,
            lr=lr,
            betas=betas,
            eps=eps,
            weight_decay=weight_decay,
            fused=_fused_default(params),
            decoupled_weight_decay=adam_w_mode,
        )
        # after torch's __init__, so that its add_param_group keeps a group's own setting;
        # groups added later get the default from self.defaults.
        self.defaults["bias_correction"] = bias_correction
        for group in self.param_groups:
            group.setdefault("bias_correction", bias_correction)
        self.set_grad_none = set_grad_none

    def __setstate__(self, state: dict) -> None:
        """Also read apex's layout (upstream GLM checkpoints): one ``step`` per group, none per
        parameter, and none of torch's group keys, whose torch defaults would turn AdamW into L2 Adam."""
        defaults = state.get("defaults") or self.defaults
        for group in state["param_groups"]:
            for key in ("decoupled_weight_decay", "fused", "bias_correction"):
                group.setdefault(key, defaults[key])
            if "step" in group:
                step = float(group.pop("step"))
                for p in group["params"]:
                    if state["state"].get(p):
                        state["state"][p].setdefault("step", step)
        super().__setstate__(state)

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        corrected = [g for g in self.param_groups if g["bias_correction"]]
        if corrected:
            with _only_groups(self, corrected):
                _base_step(torch.optim.Adam, self)
        for group in self.param_groups:
            if not group["bias_correction"]:
                self._uncorrected_adam(group)
        return loss

    def _uncorrected_adam(self, group: dict) -> None:
        """Adam without bias correction (apex ``bias_correction=False``): m / (sqrt(v) + eps)."""
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return
        if any(p.grad.is_sparse for p in params):
            raise RuntimeError("FusedAdam does not support sparse gradients")
        for p in params:
            state = self.state[p]
            if not state:
                state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        # Under torch.amp.GradScaler (this optimizer advertises _step_supports_amp_scaling, as torch's
        # fused Adam does) the scaler leaves unscaling and the inf check to the optimizer.
        grads = [p.grad for p in params]
        found_inf, grad_scale = getattr(self, "found_inf", None), getattr(self, "grad_scale", None)
        if found_inf is not None and found_inf.item():
            return
        if grad_scale is not None:
            grads = torch._foreach_div(grads, grad_scale)
        states = [self.state[p] for p in params]
        exp_avgs = [s["exp_avg"] for s in states]
        exp_avg_sqs = [s["exp_avg_sq"] for s in states]
        torch._foreach_add_([s["step"] for s in states], 1)

        lr, (beta1, beta2), eps, weight_decay = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        if weight_decay:
            if group["decoupled_weight_decay"]:
                torch._foreach_mul_(params, 1 - lr * weight_decay)
            else:
                grads = torch._foreach_add(grads, params, alpha=weight_decay)
        torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - beta2)
        denom = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_add_(denom, eps)
        torch._foreach_addcdiv_(params, exp_avgs, denom, -lr)


class FusedSGD(_ApexOptimizer, torch.optim.SGD):
    """apex's ``FusedSGD`` on ``torch.optim.SGD``.

    ``wd_after_momentum=True`` adds ``weight_decay * w`` to the update after momentum, which equals
    shrinking the weights by ``1 - lr * weight_decay`` before a decay-free SGD step.
    ``materialize_master_grads`` concerns apex's fp16 master weights and changes nothing here.
    """

    _options = ("set_grad_none", "materialize_master_grads")

    def __init__(
        self,
        params,
        lr: float,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        wd_after_momentum: bool = False,
        materialize_master_grads: bool = True,
        set_grad_none: bool = False,
    ):
        params = _listed(params)
        super().__init__(
            params,
            lr=lr,
            momentum=momentum,
            dampening=dampening,
            weight_decay=weight_decay,
            nesterov=nesterov,
            fused=_fused_default(params),
        )
        self.defaults["wd_after_momentum"] = wd_after_momentum  # as bias_correction in FusedAdam
        for group in self.param_groups:
            group.setdefault("wd_after_momentum", wd_after_momentum)
        self.materialize_master_grads = materialize_master_grads
        self.set_grad_none = set_grad_none

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        found_inf = getattr(self, "found_inf", None)  # set by torch.amp.GradScaler: skip this step
        skipped = found_inf is not None and bool(found_inf.item())
        groups = []
        for group in self.param_groups:
            if group["wd_after_momentum"] and group["weight_decay"] and not skipped:
                params = [p for p in group["params"] if p.grad is not None]
                if params:
                    torch._foreach_mul_(params, 1 - group["lr"] * group["weight_decay"])
                group = {**group, "weight_decay": 0.0}  # same params and state, decay already applied
            groups.append(group)
        with _only_groups(self, groups):
            _base_step(torch.optim.SGD, self)
        return loss


class DeepSpeedCPUAdam(FusedAdam):
    """DeepSpeed's ``DeepSpeedCPUAdam``: ``FusedAdam`` with ``adamw_mode`` for ``adam_w_mode``.

    ``fp32_optimizer_states=True`` promises fp32 moments; torch keeps moments in the parameters'
    dtype, so the promise holds only for fp32 parameters and anything else is refused.
    """

    _options = ("set_grad_none", "fp32_optimizer_states")

    def __init__(
        self,
        model_params,
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        adamw_mode: bool = True,
        fp32_optimizer_states: bool = True,
    ):
        super().__init__(
            model_params,
            lr=lr,
            bias_correction=bias_correction,
            betas=betas,
            eps=eps,
            adam_w_mode=adamw_mode,
            weight_decay=weight_decay,
            amsgrad=amsgrad,
        )
        if fp32_optimizer_states:
            for group in self.param_groups:
                for p in group["params"]:
                    if p.dtype != torch.float32:
                        raise ValueError(
                            f"DeepSpeedCPUAdam(fp32_optimizer_states=True) needs fp32 parameters, got {p.dtype}: "
                            "keep fp32 master weights (as DeepSpeed's ZeRO-Offload does) or pass "
                            "fp32_optimizer_states=False"
                        )
        self.fp32_optimizer_states = fp32_optimizer_states
