"""The CUDA path's math, run eagerly on CPU: on a GPU torch.compile fuses these same functions.

``compiled_on_first_use`` keeps the plain function as ``__wrapped__``; the compiler itself is
not exercised here (no GPU on the test machine, and compiling for CPU takes a minute).
"""

import torch

from shim.ops import _cuda, bias_act, bias_dropout, softmax_rows


def test_compiled_on_first_use_defers_compilation(monkeypatch):
    compiled = []

    def fake_compile(fn, **kwargs):
        compiled.append(kwargs)
        return fn

    monkeypatch.setattr(torch, "compile", fake_compile)
    double = _cuda.compiled_on_first_use(lambda x: 2 * x)
    assert compiled == []
    assert double(torch.ones(2)).tolist() == [2.0, 2.0] and double(torch.ones(1)).tolist() == [2.0]
    assert compiled == [{"dynamic": True}]


def test_cross_entropy_kernels():
    """Against float64 references written here: logsumexp by its max-shift definition, the gradient by autograd."""
    logits = (3 * torch.randn(37, 101)).to(torch.bfloat16)
    labels = torch.randint(0, 101, (37,))
    grad_loss = torch.rand(37)
    lse = softmax_rows._logsumexp_cuda.__wrapped__(logits)
    assert lse.dtype == torch.float32
    wide = logits.double()
    top = wide.max(dim=1).values
    expected_lse = top + (wide - top[:, None]).exp().sum(dim=1).log()
    torch.testing.assert_close(lse.double(), expected_lse, rtol=1e-6, atol=1e-6)
    grad = softmax_rows._softmax_grad_cuda.__wrapped__(logits, labels, lse, grad_loss)
    leaf = wide.clone().requires_grad_()
    (torch.nn.functional.cross_entropy(leaf, labels, reduction="none") * grad_loss.double()).sum().backward()
    assert grad.dtype == torch.bfloat16
    # one bf16 rounding of the fp32 result: within half a bf16 ulp, relative
    torch.testing.assert_close(grad.double(), leaf.grad, rtol=2**-8, atol=1e-7)


def _gelu_tanh_upstream(x):
    """GLM's ``gelu_impl`` (mpu/utils-era OpenAI GELU), written out in float64."""
    x = x.double()
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * x * (1.0 + 0.044715 * x * x)))


def test_bias_gelu_and_dropout_kernels():
    x, bias, residual = 2 * torch.randn(8, 16), torch.randn(16), torch.randn(8, 16)
    gelu = bias_act._bias_gelu_cuda.__wrapped__(x, bias, "tanh")
    torch.testing.assert_close(gelu.double(), _gelu_tanh_upstream(x + bias), rtol=1e-6, atol=1e-6)
    exact = bias_act._bias_gelu_cuda.__wrapped__(x, bias, "none")
    xb = (x + bias).double()
    torch.testing.assert_close(exact.double(), 0.5 * xb * (1 + torch.erf(xb / 2**0.5)), rtol=1e-6, atol=1e-6)
    assert (gelu - exact).abs().max() > 1e-4  # the two formulas are told apart at this scale
    out = bias_dropout._bias_dropout_cuda.__wrapped__(x, bias, 0.5, residual)
    dropped = out - residual
    kept = dropped != 0
    torch.testing.assert_close(dropped[kept], 2 * (x + bias)[kept])
