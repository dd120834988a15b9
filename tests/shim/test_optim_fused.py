"""apex / DeepSpeed optimizer fallbacks follow torch's AdamW / Adam / SGD step for step."""

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from shim.optim import DeepSpeedCPUAdam, FusedAdam, FusedSGD

STEPS = 20


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 4))


def _glm_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """GLM's grouping: weight decay on weights, none on biases."""
    named = list(model.named_parameters())
    decay = [p for n, p in named if not n.endswith("bias")]
    no_decay = [p for n, p in named if n.endswith("bias")]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def _train(model: torch.nn.Module, optimizer: torch.optim.Optimizer, steps: int = STEPS) -> torch.nn.Module:
    data = torch.Generator().manual_seed(1)
    for _ in range(steps):
        x = torch.randn(5, 8, generator=data)
        optimizer.zero_grad()
        model(x).pow(2).mean().backward()
        optimizer.step()
    return model


def _pair(make_ours, make_theirs, steps: int = STEPS):
    """Train two copies of one model, one per optimizer factory; return (start, ours, theirs)."""
    start = _model()
    ours, theirs = copy.deepcopy(start), copy.deepcopy(start)
    _train(ours, make_ours(ours), steps)
    _train(theirs, make_theirs(theirs), steps)
    return start, ours, theirs


def _assert_same(a: torch.nn.Module, b: torch.nn.Module, atol: float = 1e-6) -> None:
    for (name, pa), pb in zip(a.named_parameters(), b.parameters()):
        torch.testing.assert_close(pa, pb, atol=atol, rtol=0, msg=lambda m, name=name: f"{name}: {m}")


def _assert_moved(model: torch.nn.Module, start: torch.nn.Module) -> None:
    assert any(not torch.equal(p, q) for p, q in zip(model.parameters(), start.parameters()))


@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_fused_adam_is_adamw(weight_decay):
    kw = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-6)
    start, ours, theirs = _pair(
        lambda m: FusedAdam(_glm_groups(m, weight_decay), **kw),
        lambda m: torch.optim.AdamW(_glm_groups(m, weight_decay), **kw),
    )
    _assert_moved(ours, start)
    _assert_same(ours, theirs)


def test_fused_adam_l2_mode_is_adam():
    kw = dict(lr=1e-2, weight_decay=0.1)
    start, ours, theirs = _pair(
        lambda m: FusedAdam(m.parameters(), adam_w_mode=False, **kw),
        lambda m: torch.optim.Adam(m.parameters(), **kw),
    )
    _assert_moved(ours, start)
    _assert_same(ours, theirs)


@settings(max_examples=10, deadline=None)
@given(
    lr=st.floats(1e-4, 1e-1),
    beta1=st.floats(0.0, 0.99),
    beta2=st.floats(0.9, 0.9999),
    eps=st.floats(1e-10, 1e-3),
    weight_decay=st.floats(0.0, 0.5),
    adam_w_mode=st.booleans(),
)
def test_fused_adam_matches_torch_for_any_hyperparameters(lr, beta1, beta2, eps, weight_decay, adam_w_mode):
    kw = dict(lr=lr, betas=(beta1, beta2), eps=eps, weight_decay=weight_decay)
    reference = torch.optim.AdamW if adam_w_mode else torch.optim.Adam
    _, ours, theirs = _pair(
        lambda m: FusedAdam(m.parameters(), adam_w_mode=adam_w_mode, **kw), lambda m: reference(m.parameters(), **kw), steps=5
    )
    _assert_same(ours, theirs, atol=1e-5)


def test_fused_adam_weight_decay_defaults_to_zero_not_adamw_001():
    # The trap: torch.optim.AdamW decays by 0.01 unless told otherwise; apex's FusedAdam by 0.
    _, ours, plain_adam = _pair(lambda m: FusedAdam(m.parameters(), lr=1e-2), lambda m: torch.optim.Adam(m.parameters(), lr=1e-2))
    _assert_same(ours, plain_adam)
    _, _, adamw_default = _pair(lambda m: FusedAdam(m.parameters()), lambda m: torch.optim.AdamW(m.parameters(), lr=1e-2))
    assert any(not torch.allclose(p, q, atol=1e-6) for p, q in zip(ours.parameters(), adamw_default.parameters()))


def test_amsgrad_raises_like_apex():
    with pytest.raises(RuntimeError, match="does not support the AMSGrad variant"):
        FusedAdam(_model().parameters(), amsgrad=True)


def _reference_adam_without_bias_correction(params, grads_per_step, lr, betas, eps, weight_decay, decoupled):
    """Hand-written apex math with bias_correction=False, one tensor at a time."""
    params = [p.detach().clone() for p in params]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    for grads in grads_per_step:
        for i, (p, g) in enumerate(zip(params, grads)):
            if not decoupled:
                g = g + weight_decay * p
            m[i] = betas[0] * m[i] + (1 - betas[0]) * g
            v[i] = betas[1] * v[i] + (1 - betas[1]) * g * g
            update = m[i] / (v[i].sqrt() + eps)
            if decoupled:
                update = update + weight_decay * p
            params[i] = p - lr * update
    return params


@pytest.mark.parametrize("adam_w_mode", [True, False])
def test_bias_correction_false_matches_reference(adam_w_mode):
    torch.manual_seed(0)
    shapes = [(4, 3), (3,), (2, 2, 2)]
    params = [torch.randn(s, requires_grad=True) for s in shapes]
    grads_per_step = [[torch.randn(s) for s in shapes] for _ in range(STEPS)]
    hyper = dict(lr=1e-2, betas=(0.8, 0.9), eps=1e-3, weight_decay=0.05)
    expected = _reference_adam_without_bias_correction(params, grads_per_step, decoupled=adam_w_mode, **hyper)
    optimizer = FusedAdam(params, bias_correction=False, adam_w_mode=adam_w_mode, **hyper)
    for grads in grads_per_step:
        for p, g in zip(params, grads):
            p.grad = g.clone()
        optimizer.step()
    for got, want in zip(params, expected):
        torch.testing.assert_close(got.detach(), want, atol=1e-6, rtol=1e-5)
    # bias correction changes the result: the reference is not accidentally plain Adam
    corrected = _reference_adam_without_bias_correction(params, grads_per_step[:1], decoupled=adam_w_mode, **hyper)
    assert not torch.allclose(corrected[0], params[0].detach())


def test_bias_correction_per_group():
    kw = dict(lr=1e-2, weight_decay=0.1)

    class TwoOptimizers:  # AdamW for the first layer, the (separately checked) uncorrected path for the last
        def __init__(self, m):
            self.parts = [torch.optim.AdamW(m[0].parameters(), **kw), FusedAdam(m[2].parameters(), bias_correction=False, **kw)]

        def zero_grad(self):
            for part in self.parts:
                part.zero_grad()

        def step(self):
            for part in self.parts:
                part.step()

    start, ours, theirs = _pair(
        lambda m: FusedAdam([{"params": m[0].parameters()}, {"params": m[2].parameters(), "bias_correction": False}], **kw),
        TwoOptimizers,
    )
    _assert_moved(ours, start)
    _assert_same(ours, theirs)
    assert FusedAdam(ours.parameters(), bias_correction=False).param_groups[0]["bias_correction"] is False


@pytest.mark.parametrize("bias_correction", [True, False])
def test_grad_scaler_unscales_and_skips_inf_steps(bias_correction):
    torch.manual_seed(0)
    grads = [torch.randn(4) for _ in range(6)]
    grads[3] = torch.full((4,), float("inf"))  # GradScaler must skip this step
    finite = [g for g in grads if g.isfinite().all()]

    def run(steps, scaler):
        w = torch.ones(4, requires_grad=True)
        opt = FusedAdam([w], lr=1e-2, weight_decay=0.1, bias_correction=bias_correction)
        for g in steps:
            opt.zero_grad()
            loss = (w * g).sum()
            (scaler.scale(loss) if scaler else loss).backward()
            scaler.step(opt) if scaler else opt.step()
            if scaler:
                scaler.update()
        return w.detach(), opt.state[w]["step"]

    scaled, scaled_steps = run(grads, torch.amp.GradScaler("cpu", init_scale=2.0**10))
    plain, plain_steps = run(finite, None)
    torch.testing.assert_close(scaled, plain, atol=1e-6, rtol=1e-6)
    assert scaled_steps == plain_steps == len(finite)


def test_fused_adam_state_dict_round_trip():
    start = _model()
    first, resumed, straight = copy.deepcopy(start), copy.deepcopy(start), copy.deepcopy(start)
    opt = FusedAdam(_glm_groups(first, 0.1), lr=1e-2)
    _train(first, opt, 10)
    saved_model, saved_opt = copy.deepcopy(first.state_dict()), copy.deepcopy(opt.state_dict())

    resumed.load_state_dict(saved_model)
    opt2 = FusedAdam(_glm_groups(resumed, 0.1), lr=1e-2)
    opt2.load_state_dict(saved_opt)
    assert opt2.param_groups[0]["weight_decay"] == 0.1 and opt2.param_groups[1]["weight_decay"] == 0.0
    _train(resumed, opt2, 10)

    uninterrupted = FusedAdam(_glm_groups(straight, 0.1), lr=1e-2)
    _train(straight, uninterrupted, 10)
    _train(straight, uninterrupted, 10)
    _assert_same(resumed, straight, atol=0)
    # torch's own AdamW reads the checkpoint too
    torch.optim.AdamW(_glm_groups(copy.deepcopy(first), 0.1)).load_state_dict(saved_opt)


def _as_apex_checkpoint(state_dict: dict) -> dict:
    """The layout apex's FusedAdam saves: a step count per group, only the moments per parameter."""
    apex = copy.deepcopy(state_dict)
    steps = {int(s.pop("step")) for s in apex["state"].values()}
    for group in apex["param_groups"]:
        kept = ("lr", "bias_correction", "betas", "eps", "weight_decay", "params")
        for key in [k for k in group if k not in kept]:
            del group[key]
        group["step"] = steps.pop() if len(steps) == 1 else next(iter(steps))
    return apex


def test_loads_apex_checkpoint_layout():
    start = _model()
    first, resumed, straight = copy.deepcopy(start), copy.deepcopy(start), copy.deepcopy(start)
    opt = FusedAdam(first.parameters(), lr=1e-2, weight_decay=0.5)
    _train(first, opt, 10)
    apex_state = _as_apex_checkpoint(opt.state_dict())
    assert "step" not in apex_state["state"][0] and "decoupled_weight_decay" not in apex_state["param_groups"][0]

    resumed.load_state_dict(first.state_dict())
    opt2 = FusedAdam(resumed.parameters(), lr=1e-2, weight_decay=0.5)
    opt2.load_state_dict(apex_state)
    assert opt2.param_groups[0]["decoupled_weight_decay"] is True  # still AdamW, not torch's L2 default
    _train(resumed, opt2, 10)

    uninterrupted = FusedAdam(straight.parameters(), lr=1e-2, weight_decay=0.5)
    _train(straight, uninterrupted, 10)
    _train(straight, uninterrupted, 10)
    _assert_same(resumed, straight, atol=0)
    assert float(opt2.state[next(resumed.parameters())]["step"]) == 20


def test_optimizer_deepcopy():
    model = _model()
    opt = FusedAdam(model.parameters(), bias_correction=False)
    _train(model, opt, 2)
    clone = copy.deepcopy(opt)
    assert clone.param_groups[0]["bias_correction"] is False and clone.set_grad_none
    sgd = copy.deepcopy(FusedSGD(model.parameters(), lr=0.1, set_grad_none=True, materialize_master_grads=False))
    assert sgd.set_grad_none and not sgd.materialize_master_grads
    assert copy.deepcopy(DeepSpeedCPUAdam(model.parameters())).fp32_optimizer_states


@pytest.mark.parametrize("make", [lambda ps: FusedAdam(ps), lambda ps: FusedAdam(ps, bias_correction=False), lambda ps: FusedSGD(ps, lr=0.1)])
def test_step_hooks_run_once(make):
    # a plain torch optimizer makes torch wrap the base class's step with the hook runner
    torch.optim.Adam([torch.zeros(1, requires_grad=True)])
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    w = torch.zeros(2, requires_grad=True)
    w.grad = torch.ones(2)
    optimizer, calls = make([w]), []
    optimizer.register_step_pre_hook(lambda *args: calls.append("pre"))
    optimizer.register_step_post_hook(lambda *args: calls.append("post"))
    optimizer.step()
    assert calls == ["pre", "post"]
    assert not torch.equal(w, torch.zeros(2))


def test_set_grad_none_drives_zero_grad():
    model = torch.nn.Linear(2, 2)
    model(torch.ones(1, 2)).sum().backward()
    FusedAdam(model.parameters(), set_grad_none=False).zero_grad()
    assert model.weight.grad is not None and not model.weight.grad.any()
    FusedAdam(model.parameters()).zero_grad()
    assert model.weight.grad is None


@pytest.mark.parametrize(
    "sgd_kw",
    [dict(momentum=0.0), dict(momentum=0.9, weight_decay=0.01), dict(momentum=0.9, dampening=0.1), dict(momentum=0.9, nesterov=True, weight_decay=0.01)],
)
def test_fused_sgd_is_sgd(sgd_kw):
    start, ours, theirs = _pair(lambda m: FusedSGD(m.parameters(), lr=0.05, **sgd_kw), lambda m: torch.optim.SGD(m.parameters(), lr=0.05, **sgd_kw))
    _assert_moved(ours, start)
    _assert_same(ours, theirs)


def test_fused_sgd_weight_decay_after_momentum():
    torch.manual_seed(0)
    lr, momentum, wd = 0.1, 0.9, 0.2
    w = torch.randn(3, requires_grad=True)
    grads = [torch.randn(3) for _ in range(5)]
    expected, buf = w.detach().clone(), None
    for g in grads:  # apex: momentum on the raw gradient, then add decay of the current weights
        buf = g.clone() if buf is None else momentum * buf + g
        expected = expected - lr * (buf + wd * expected)
    opt = FusedSGD([w], lr=lr, momentum=momentum, weight_decay=wd, wd_after_momentum=True)
    for g in grads:
        w.grad = g.clone()
        opt.step()
    torch.testing.assert_close(w.detach(), expected, atol=1e-6, rtol=1e-6)
    assert opt.param_groups[0]["weight_decay"] == wd  # the group keeps what the user set


def test_fused_sgd_weight_decay_after_momentum_skips_inf_steps():
    w = torch.ones(3, requires_grad=True)
    opt = FusedSGD([w], lr=0.1, momentum=0.9, weight_decay=0.5, wd_after_momentum=True)
    scaler = torch.amp.GradScaler("cpu")
    scaler.scale((w * float("inf")).sum()).backward()
    scaler.step(opt)
    assert torch.equal(w.detach(), torch.ones(3))


def test_fused_sgd_keeps_apex_zero_grad_default():
    model = torch.nn.Linear(2, 2)
    model(torch.ones(1, 2)).sum().backward()
    FusedSGD(model.parameters(), lr=0.1).zero_grad()
    assert model.weight.grad is not None


def test_deepspeed_cpu_adam_is_adamw_with_deepspeed_names():
    kw = dict(lr=1e-2, weight_decay=0.1)
    _, ours, theirs = _pair(lambda m: DeepSpeedCPUAdam(m.parameters(), **kw), lambda m: torch.optim.AdamW(m.parameters(), **kw))
    _assert_same(ours, theirs)
    _, ours_l2, adam = _pair(
        lambda m: DeepSpeedCPUAdam(m.parameters(), adamw_mode=False, **kw), lambda m: torch.optim.Adam(m.parameters(), **kw)
    )
    _assert_same(ours_l2, adam)


def test_deepspeed_cpu_adam_refuses_half_params_with_fp32_states():
    with pytest.raises(ValueError, match="fp32_optimizer_states"):
        DeepSpeedCPUAdam([torch.zeros(2, dtype=torch.bfloat16, requires_grad=True)])
    DeepSpeedCPUAdam([torch.zeros(2, dtype=torch.bfloat16, requires_grad=True)], fp32_optimizer_states=False)
