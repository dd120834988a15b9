"""The layer-norm extension stand-ins (apex fused_layer_norm_cuda, Megatron fused_mix_prec_layer_norm_cuda)
and apex's other layers against the written-out math: mean, 1/sqrt(var + eps), affine; dtypes as the kernels."""

from __future__ import annotations

import pytest
import torch

import shim.kernels.fused_layer_norm_cuda as apex_ln
import shim.kernels.fused_mix_prec_layer_norm_cuda as megatron_ln
import shim.nn as snn


def reference(x, w, b, eps):
    x64 = x.double()
    mean = x64.mean(-1, keepdim=True)
    invvar = 1 / ((x64 - mean).pow(2).mean(-1, keepdim=True) + eps).sqrt()
    out = (x64 - mean) * invvar
    if w is not None:
        out = out * w.double() + b.double()
    return out, mean.flatten(), invvar.flatten()


def test_forward_affine_statistics_and_output():
    x, w, b = torch.randn(3, 5, 8), torch.randn(8), torch.randn(8)
    out, mean, invvar = apex_ln.forward_affine(x, [8], w, b, 1e-5)
    e_out, e_mean, e_invvar = reference(x, w, b, 1e-5)
    assert mean.shape == invvar.shape == (15,) and mean.dtype == torch.float32
    torch.testing.assert_close(out.double(), e_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(mean.double(), e_mean, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(invvar.double(), e_invvar, atol=1e-5, rtol=1e-5)


def test_mixed_precision_output_takes_the_weight_dtype():
    x, w, b = torch.randn(4, 16).half(), torch.randn(16), torch.randn(16)
    out, mean, _ = megatron_ln.forward_affine(x, [16], w, b, 1e-5)
    assert out.dtype == torch.float32 and mean.dtype == torch.float32  # Megatron: empty_like(input, gamma's dtype)
    assert apex_ln.forward_affine(x, [16], w, b, 1e-5)[0].dtype == torch.float16  # apex: the input's
    torch.testing.assert_close(out.double(), reference(x, w, b, 1e-5)[0], atol=1e-5, rtol=1e-5)


def test_backward_affine_is_the_gradient_of_the_math():
    x = torch.randn(6, 10, dtype=torch.float64, requires_grad=True)
    w = torch.randn(10, dtype=torch.float64, requires_grad=True)
    b = torch.randn(10, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(6, 10, dtype=torch.float64)
    expected = torch.autograd.grad(reference(x, w, b, 1e-5)[0], (x, w, b), dy)
    _, mean, invvar = apex_ln.forward_affine(x.detach(), [10], w.detach(), b.detach(), 1e-5)
    got = apex_ln.backward_affine(dy, mean, invvar, x.detach(), [10], w.detach(), b.detach(), 1e-5)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=1e-5, rtol=1e-5)
    out = apex_ln.forward_affine(x.detach(), [10], w.detach(), b.detach(), 1e-5)[0]
    from_output = apex_ln.backward_affine(dy, mean, invvar, out, [10], w.detach(), b.detach(), 1e-5, True)
    torch.testing.assert_close(from_output[0], expected[0], atol=1e-5, rtol=1e-5)  # memory_efficient


def test_rms_forward_and_backward():
    x = torch.randn(4, 6, dtype=torch.float64, requires_grad=True)
    w = torch.randn(6, dtype=torch.float64, requires_grad=True)
    expected = x * (x.pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt() * w
    out, invvar = apex_ln.rms_forward_affine(x.detach(), [6], w.detach(), 1e-6)
    torch.testing.assert_close(out, expected.detach(), atol=1e-6, rtol=1e-6)
    dy = torch.randn(4, 6, dtype=torch.float64)
    e_dx, e_dw = torch.autograd.grad(expected, (x, w), dy)
    dx, dw = apex_ln.rms_backward_affine(dy, invvar, x.detach(), [6], w.detach(), 1e-6)
    torch.testing.assert_close(dx, e_dx, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dw, e_dw, atol=1e-5, rtol=1e-5)


def test_fused_layer_norm_affine_function_gradients():
    x = torch.randn(3, 8, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    b = torch.randn(8, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(3, 8, dtype=torch.float64)
    expected = torch.autograd.grad(reference(x, w, b, 1e-5)[0], (x, w, b), dy)
    got = torch.autograd.grad(snn.FusedLayerNormAffineFunction.apply(x, w, b, torch.Size([8]), 1e-5), (x, w, b), dy)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, atol=1e-6, rtol=1e-6)


def test_apex_layers_keep_their_parameter_names():
    assert set(dict(snn.FusedDense(4, 3).named_parameters())) == {"weight", "bias"}
    gelu_dense = snn.FusedDenseGeluDense(4, 8, 3)
    assert set(dict(gelu_dense.named_parameters())) == {"weight1", "bias1", "weight2", "bias2"}
    x = torch.randn(2, 4)
    h = torch.nn.functional.gelu(x @ gelu_dense.weight1.T + gelu_dense.bias1)
    torch.testing.assert_close(gelu_dense(x), h @ gelu_dense.weight2.T + gelu_dense.bias2)
    assert set(dict(snn.FusedRMSNorm(4).named_parameters())) == {"weight"}
    assert snn.FastLayerNorm(4, eps=1e-6).eps == 1e-6


def test_nvtx_ranges_are_no_ops_without_cuda():
    import shim.cuda.nvtx as nvtx

    nvtx.range_push("step")
    nvtx.range_pop()
    with nvtx.range("block"):
        pass


def test_tensor_type_names_the_active_device_as_cuda(monkeypatch):
    from shim.compat.devices import tensor_type

    # The CPU stands in for CUDA (what a machine without a GPU gets; forced, so a GPU machine tests it too).
    monkeypatch.setenv("SHIM_DEVICE", "cpu")
    assert tensor_type(torch.zeros(1)) == "torch.cuda.FloatTensor"
    assert tensor_type(torch.zeros(1, dtype=torch.half)) == "torch.cuda.HalfTensor"
    assert torch.zeros(1).type() == "torch.FloatTensor"  # torch itself is untouched
    # With a CUDA GPU active (a GPU machine's default), a CPU tensor is not on it: torch's own name.
    monkeypatch.setenv("SHIM_DEVICE", "cuda")
    assert tensor_type(torch.zeros(1)) == "torch.FloatTensor"
    assert tensor_type(torch.zeros(1, dtype=torch.half)) == "torch.HalfTensor"


@pytest.mark.parametrize("name", ["amp_C", "fused_layer_norm_cuda", "scaled_masked_softmax_cuda",
                                  "scaled_upper_triang_masked_softmax_cuda", "fused_mix_prec_layer_norm_cuda",
                                  "megatron_fused_kernels"])
def test_kernel_stand_ins_load_as_attributes(name):
    import shim

    assert getattr(shim.kernels, name).__name__ == f"shim.kernels.{name}"


def test_tensor_type_converts_to_cuda_named_types_on_the_active_device(monkeypatch):
    from shim.compat import cudaless
    from shim.compat.devices import tensor_type

    monkeypatch.setenv("SHIM_DEVICE", "cpu")  # the CPU stands in for CUDA, on a GPU machine too
    x = torch.zeros(2)
    assert tensor_type(x, tensor_type(x)).dtype == torch.float32  # the round trip GLM's fp16 code does
    assert tensor_type(x, "torch.cuda.HalfTensor").dtype == torch.float16
    assert tensor_type(x, cudaless.HalfTensor).dtype == torch.float16
    assert tensor_type(x, torch.DoubleTensor).dtype == torch.float64


    class Other:  # not a tensor: its own type() is called, arguments as given
        def type(self, *args):
            return ("own", args)

    assert tensor_type(Other(), 3) == ("own", (3,)) and tensor_type(Other()) == ("own", ())
