"""fused_bias_add_gelu: GLM's tanh GELU of x + bias, values and gradients against references."""

import math

import pytest
import torch

import shim.nn.functional as F


def glm_gelu(x):
    """GLM's gelu_impl formula, written out."""
    return 0.5 * x * (1.0 + torch.tanh(0.7978845608028654 * x * (1.0 + 0.044715 * x * x)))


def make_inputs(dtype=torch.float32, shape=(4, 3, 16), seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = (3 * torch.randn(*shape, generator=generator, dtype=torch.float64)).to(dtype)
    bias = torch.randn(shape[-1], generator=generator, dtype=torch.float64).to(dtype)
    return x.requires_grad_(), bias.requires_grad_()


@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_gradcheck_float64(approximate):
    x, bias = make_inputs(torch.float64, shape=(3, 5))
    assert torch.autograd.gradcheck(lambda a, b: F.fused_bias_add_gelu(a, b, approximate), (x, bias))


def test_default_is_glm_tanh_formula():
    x, bias = make_inputs(torch.float64)
    torch.testing.assert_close(F.fused_bias_add_gelu(x, bias), glm_gelu(x + bias), rtol=1e-12, atol=1e-12)
    erf = F.fused_bias_add_gelu(x, bias, approximate="none")
    torch.testing.assert_close(erf, 0.5 * (x + bias) * (1 + torch.erf((x + bias) / math.sqrt(2))))
    assert (erf - glm_gelu(x + bias)).abs().max() > 1e-5  # the two forms really differ


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("approximate", ["tanh", "none"])
def test_matches_composed_values_and_gradients(dtype, tol, approximate):
    x, bias = make_inputs(dtype)
    grad = torch.randn(x.shape, dtype=torch.float64).to(dtype)
    out = F.fused_bias_add_gelu(x, bias, approximate)
    out.backward(grad)
    fused = (out.detach(), x.grad, bias.grad)
    x.grad = bias.grad = None
    ref = torch.nn.functional.gelu(x + bias, approximate=approximate)
    ref.backward(grad)
    assert out.dtype == dtype
    for got, want in zip(fused, (ref.detach(), x.grad, bias.grad)):
        torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def test_bias_without_grad():
    x, bias = make_inputs()
    F.fused_bias_add_gelu(x, bias.detach()).sum().backward()
    assert x.grad is not None


@pytest.mark.parametrize(
    "x, bias, kwargs, error, message",
    [
        (torch.randn(2, 4), torch.randn(3), {}, ValueError, r"bias shape \(3,\) must be \[x.shape\[-1\]\]"),
        (torch.randn(2, 4), torch.randn(2, 4), {}, ValueError, "bias shape"),
        (torch.randn(2, 4), torch.randn(4, dtype=torch.float64), {}, TypeError, "bias dtype"),
        (torch.ones(2, 4, dtype=torch.long), torch.ones(4, dtype=torch.long), {}, TypeError, "floating point"),
        (torch.randn(2, 4), torch.randn(4), {"approximate": "erf"}, ValueError, "approximate must be one of"),
    ],
)
def test_bad_input_is_one_clear_error(x, bias, kwargs, error, message):
    with pytest.raises(error, match=message):
        F.fused_bias_add_gelu(x, bias, **kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_is_bit_identical_to_composed(dtype):
    x, bias = make_inputs(dtype)
    with torch.no_grad():
        assert torch.equal(F.fused_bias_add_gelu(x, bias), torch.nn.functional.gelu(x + bias, approximate="tanh"))
