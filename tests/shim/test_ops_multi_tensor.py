"""amp_C through multi_tensor_applier against apex's documented math (csrc/multi_tensor_*.cu),
written here per tensor in float64: argument order, return shapes, the overflow flag."""

from __future__ import annotations

import math

import pytest
import torch

import shim.kernels.amp_C as amp_C
from shim.apex.multi_tensor_apply import MultiTensorApply, multi_tensor_applier


def tensors(seed, dtype=torch.float32, shapes=((3, 4), (7,), (2, 2, 2))):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g).to(dtype) for s in shapes]


def flag():
    return torch.zeros(1, dtype=torch.int)


def test_applier_passes_chunk_size_and_arguments_in_apex_order():
    seen = []
    applier = MultiTensorApply(1234)
    applier(lambda *a: seen.append(a), "noop", "lists", 1, 2)
    assert seen == [(1234, "noop", "lists", 1, 2)]
    assert multi_tensor_applier.available and multi_tensor_applier.chunk_size == 2048 * 32


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_scale_writes_out_and_flags_only_non_finite_inputs(dtype):
    src = tensors(0, dtype)
    out = [torch.empty_like(t, dtype=torch.float32) for t in src]
    noop = flag()
    multi_tensor_applier(amp_C.multi_tensor_scale, noop, [src, out], 0.5)
    for s, o in zip(src, out):
        torch.testing.assert_close(o.double(), s.double() * 0.5)
    assert noop.item() == 0
    src[1][3] = float("inf")
    multi_tensor_applier(amp_C.multi_tensor_scale, noop, [src, out], 0.5)
    assert noop.item() == 1 and math.isinf(out[1][3].item())  # written all the same, as apex
    multi_tensor_applier(amp_C.multi_tensor_scale, noop, [tensors(1, dtype), out], 1.0)
    assert noop.item() == 1  # the flag is never cleared by a kernel


def test_scale_in_place_unscales_gradients():
    grads = tensors(2)
    expected = [g.double() / 1024 for g in grads]
    multi_tensor_applier(amp_C.multi_tensor_scale, flag(), [grads, grads], 1 / 1024)
    for g, e in zip(grads, expected):
        torch.testing.assert_close(g.double(), e)


@pytest.mark.parametrize("per_tensor", [False, True])
def test_l2norm_returns_apex_shapes(per_tensor):
    ts = tensors(3, torch.float16)
    total, each = multi_tensor_applier(amp_C.multi_tensor_l2norm, flag(), [ts], per_tensor)
    norms = [math.sqrt(sum(float(v) ** 2 for v in t.double().flatten())) for t in ts]
    assert total.shape == (1,) and total.dtype == torch.float32
    assert total.item() == pytest.approx(math.sqrt(sum(n * n for n in norms)), rel=1e-5)
    if per_tensor:
        assert each.shape == (3,) and each.dtype == torch.float32
        assert each.tolist() == pytest.approx(norms, rel=1e-5)
    else:
        assert each.shape == (0,)


def test_l2norm_flags_nan():
    ts = tensors(4)
    ts[0][0, 0] = float("nan")
    noop = flag()
    total, _ = amp_C.multi_tensor_l2norm(65536, noop, [ts], False)
    assert noop.item() == 1 and math.isnan(total.item())


def test_l2norm_scale_and_unscale_l2norm():
    ts = tensors(5)
    out = [torch.empty_like(t) for t in ts]
    total, _ = amp_C.multi_tensor_l2norm_scale(65536, flag(), [ts, out], 3.0, False)
    plain = math.sqrt(sum(float((t.double() ** 2).sum()) for t in ts))
    assert total.item() == pytest.approx(plain, rel=1e-6)
    for t, o in zip(ts, out):
        torch.testing.assert_close(o, t * 3.0)
    total, _ = amp_C.multi_tensor_unscale_l2norm(65536, flag(), [ts], torch.tensor([0.25]), False)
    assert total.item() == pytest.approx(plain * 0.25, rel=1e-6)


@pytest.mark.parametrize("check,flagged", [(0, False), (1, True), (-1, True)])
def test_axpby_and_its_argument_check(check, flagged):
    xs, ys = tensors(6), tensors(7)
    ys[2][0, 0, 0] = float("inf")
    out = [torch.empty_like(t) for t in xs]
    noop = flag()
    amp_C.multi_tensor_axpby(65536, noop, [xs, ys, out], 2.0, -0.5, check)
    assert noop.item() == int(flagged)
    torch.testing.assert_close(out[0].double(), 2.0 * xs[0].double() - 0.5 * ys[0].double())


def reference_adam(g, p, m, v, lr, b1, b2, eps, step, mode, bias_correction, wd):
    g, p, m, v = (t.double().clone() for t in (g, p, m, v))
    if mode == 0:
        g = g + wd * p
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * g * g
    c1 = 1 - b1 ** step if bias_correction else 1
    c2 = 1 - b2 ** step if bias_correction else 1
    update = (m / c1) / ((v / c2).sqrt() + eps)
    if mode == 1:
        update = update + wd * p
    return p - lr * update, m, v


@pytest.mark.parametrize("mode", [0, 1])
@pytest.mark.parametrize("bias_correction", [0, 1])
def test_adam_matches_apex_math(mode, bias_correction):
    grads, params = tensors(8), tensors(9)
    ms = [torch.rand_like(p) * 0.1 for p in params]
    vs = [torch.rand_like(p) * 0.01 for p in params]
    expected = [reference_adam(g, p, m, v, 1e-2, 0.9, 0.99, 1e-8, 3, mode, bias_correction, 0.1)
                for g, p, m, v in zip(grads, params, ms, vs)]
    grads_before = [g.clone() for g in grads]
    multi_tensor_applier(amp_C.multi_tensor_adam, flag(), [grads, params, ms, vs],
                         1e-2, 0.9, 0.99, 1e-8, 3, mode, bias_correction, 0.1)
    for (ep, em, ev), p, m, v in zip(expected, params, ms, vs):
        torch.testing.assert_close(p.double(), ep, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(m.double(), em, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(v.double(), ev, rtol=1e-5, atol=1e-9)
    assert all(torch.equal(a, b) for a, b in zip(grads, grads_before))


def test_adam_capturable_unscales_and_honours_the_flag():
    grads, params = tensors(10), tensors(11)
    ms, vs = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    before = [p.clone() for p in params]
    noop = torch.ones(1, dtype=torch.int)
    args = (torch.tensor([1e-3]), 0.9, 0.999, 1e-8, torch.tensor([1]), 1, 1, 0.0, torch.tensor([0.5]))
    amp_C.multi_tensor_adam_capturable(65536, noop, [grads, params, ms, vs], *args)
    assert all(torch.equal(a, b) for a, b in zip(params, before))  # skipped: the flag was set
    amp_C.multi_tensor_adam_capturable(65536, flag(), [grads, params, ms, vs], *args)
    ep, _, _ = reference_adam(grads[0] * 0.5, before[0], torch.zeros_like(before[0]), torch.zeros_like(before[0]),
                              1e-3, 0.9, 0.999, 1e-8, 1, 1, 1, 0.0)
    torch.testing.assert_close(params[0].double(), ep, rtol=1e-5, atol=1e-7)


def reference_sgd(g, p, buf, wd, momentum, dampening, lr, nesterov, first_run, wd_after, scale):
    g, p, buf = g.double() * scale, p.double().clone(), buf.double().clone()
    if wd and not wd_after:
        g = g + wd * p
    if momentum:
        buf = g.clone() if first_run else buf * momentum + (1 - dampening) * g
        g = g + momentum * buf if nesterov else buf
    if wd and wd_after:
        g = g + wd * p
    return p - lr * g, buf


@pytest.mark.parametrize("nesterov,first_run,wd_after", [(False, True, False), (True, False, False), (False, False, True)])
def test_sgd_matches_apex_math(nesterov, first_run, wd_after):
    grads, params = tensors(12), tensors(13)
    bufs = [torch.randn_like(p) for p in params]
    expected = [reference_sgd(g, p, b, 0.01, 0.9, 0.1, 0.05, nesterov, first_run, wd_after, 0.5)
                for g, p, b in zip(grads, params, bufs)]
    halves = [torch.empty_like(p, dtype=torch.float16) for p in params]
    amp_C.multi_tensor_sgd(65536, flag(), [grads, params, bufs, halves], 0.01, 0.9, 0.1, 0.05, nesterov, first_run,
                           wd_after, 0.5)
    for (ep, eb), p, b, h in zip(expected, params, bufs, halves):
        torch.testing.assert_close(p.double(), ep, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(b.double(), eb, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(h, p.half())


def test_sgd_skips_while_flagged():
    grads, params = tensors(14), tensors(15)
    before = [p.clone() for p in params]
    amp_C.multi_tensor_sgd(65536, torch.ones(1, dtype=torch.int), [grads, params, [torch.zeros_like(p) for p in params]],
                           0.0, 0.0, 0.0, 0.1, False, True, False, 1.0)
    assert all(torch.equal(a, b) for a, b in zip(params, before))


@pytest.mark.parametrize("mode", [0, 1])
def test_adagrad_matches_apex_math(mode):
    grads, params = tensors(16), tensors(17)
    sums = [torch.rand_like(p) for p in params]
    expected = []
    for g, p, h in zip(grads, params, sums):
        g64, p64, h64 = g.double(), p.double(), h.double()
        if mode == 0:
            g64 = g64 + 0.1 * p64
        h64 = h64 + g64 * g64
        update = g64 / (h64.sqrt() + 1e-10) + (0.1 * p64 if mode == 1 else 0)
        expected.append((p64 - 0.01 * update, h64))
    amp_C.multi_tensor_adagrad(65536, flag(), [grads, params, sums], 0.01, 1e-10, mode, 0.1)
    for (ep, eh), p, h in zip(expected, params, sums):
        torch.testing.assert_close(p.double(), ep, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(h.double(), eh, rtol=1e-5, atol=1e-6)


def test_kernels_without_an_equivalent_say_so():
    with pytest.raises(AttributeError, match="multi_tensor_lamb .*no shim equivalent"):
        amp_C.multi_tensor_lamb
