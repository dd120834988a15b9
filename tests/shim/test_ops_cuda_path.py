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
    logits = torch.randn(37, 101).to(torch.bfloat16)
    labels = torch.randint(0, 101, (37,))
    grad_loss = torch.rand(37)
    lse = softmax_rows._logsumexp_cuda.__wrapped__(logits)
    assert lse.dtype == torch.float32
    torch.testing.assert_close(lse, torch.logsumexp(logits.float(), dim=1))
    grad = softmax_rows._softmax_grad_cuda.__wrapped__(logits, labels, lse, grad_loss)
    expected = (torch.softmax(logits.float(), 1) - torch.nn.functional.one_hot(labels, 101)) * grad_loss[:, None]
    assert grad.dtype == torch.bfloat16
    torch.testing.assert_close(grad.float(), expected, rtol=0, atol=torch.finfo(torch.bfloat16).eps)


def test_bias_gelu_and_dropout_kernels():
    x, bias, residual = torch.randn(8, 16), torch.randn(16), torch.randn(8, 16)
    torch.testing.assert_close(
        bias_act._bias_gelu_cuda.__wrapped__(x, bias, "tanh"), torch.nn.functional.gelu(x + bias, approximate="tanh")
    )
    out = bias_dropout._bias_dropout_cuda.__wrapped__(x, bias, 0.5, residual)
    dropped = out - residual
    kept = dropped != 0
    torch.testing.assert_close(dropped[kept], 2 * (x + bias)[kept])
