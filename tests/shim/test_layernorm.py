"""apex FusedLayerNorm is torch.nn.LayerNorm with apex's constructor."""

import pytest
import torch

import shim
from shim.nn import FusedLayerNorm, MixedFusedLayerNorm


def test_state_dict_keys_and_values_match_torch_layernorm():
    torch.manual_seed(0)
    ours, theirs = FusedLayerNorm(16, eps=1e-5), torch.nn.LayerNorm(16, eps=1e-5)
    with torch.no_grad():
        ours.weight.normal_()
        ours.bias.normal_()
    theirs.load_state_dict(ours.state_dict())
    assert list(ours.state_dict()) == list(theirs.state_dict()) == ["weight", "bias"]
    x = torch.randn(3, 5, 16)
    torch.testing.assert_close(ours(x), theirs(x), atol=0, rtol=0)
    manual = (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)
    torch.testing.assert_close(ours(x), manual * ours.weight + ours.bias, atol=1e-5, rtol=1e-5)


def test_apex_positional_signature():
    ln = FusedLayerNorm((4, 8), 1e-6, False, True)
    assert ln.normalized_shape == (4, 8) and ln.eps == 1e-6
    assert ln.weight is None and ln.memory_efficient
    assert "memory_efficient=True" in repr(ln)
    assert isinstance(ln, torch.nn.LayerNorm)


def test_gradients_match_torch_layernorm():
    torch.manual_seed(0)
    ours, theirs = FusedLayerNorm(8), torch.nn.LayerNorm(8)
    x = torch.randn(4, 8, requires_grad=True)
    ours(x).pow(2).sum().backward()
    grad_x, grad_w = x.grad.clone(), ours.weight.grad.clone()
    x.grad = None
    theirs(x).pow(2).sum().backward()
    torch.testing.assert_close(grad_x, x.grad)
    torch.testing.assert_close(grad_w, theirs.weight.grad)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_mixed_half_input_fp32_weights(dtype):
    ln = MixedFusedLayerNorm(32)
    x = torch.randn(2, 32).to(dtype)
    out = ln(x)
    assert out.dtype == dtype and ln.weight.dtype == torch.float32
    torch.testing.assert_close(out.float(), torch.nn.functional.layer_norm(x.float(), (32,)), atol=2e-2, rtol=2e-2)


def test_exported_from_shim_nn():
    assert shim.nn.FusedLayerNorm is FusedLayerNorm and shim.nn.MixedFusedLayerNorm is FusedLayerNorm
