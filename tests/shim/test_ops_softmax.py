"""Megatron's fused softmax kernels and FusedScaleMaskSoftmax against their documented math,
written out here element by element in float64 (not through shim.ops)."""

from __future__ import annotations

import math

import pytest
import torch

import shim.kernels.scaled_masked_softmax_cuda as masked_kernel
import shim.kernels.scaled_upper_triang_masked_softmax_cuda as causal_kernel
from shim.nn import AttnMaskType, FusedScaleMaskSoftmax
from shim.ops.softmax import batch_per_block, scaled_masked_softmax, scaled_upper_triang_masked_softmax


def reference_masked(x, mask, scale):
    """softmax over the last dim of x*scale, masked scores (mask == 1) replaced by -10000."""
    x64, out = x.double(), torch.empty(x.shape, dtype=torch.float64)
    b, h, sq, sk = x.shape
    for i in range(b):
        for j in range(h):
            for r in range(sq):
                m = mask[i if mask.shape[0] > 1 else 0, 0, r]
                scores = [-10000.0 if m[c] else float(x64[i, j, r, c]) * scale for c in range(sk)]
                top = max(scores)
                e = [math.exp(s - top) for s in scores]
                out[i, j, r] = torch.tensor([v / sum(e) for v in e], dtype=torch.float64)
    return out


def reference_causal(x, scale):
    x64, out = x.double(), torch.zeros(x.shape, dtype=torch.float64)
    for i in range(x.shape[0]):
        for r in range(x.shape[1]):
            scores = [float(x64[i, r, c]) * scale for c in range(r + 1)]
            top = max(scores)
            e = [math.exp(s - top) for s in scores]
            out[i, r, : r + 1] = torch.tensor([v / sum(e) for v in e], dtype=torch.float64)
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_scaled_masked_softmax_forward_matches_the_kernel_math(dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, 6, generator=g).to(dtype)
    mask = torch.rand(2, 1, 4, 6, generator=g) > 0.6
    mask[0, 0, 1] = True  # a fully masked row: uniform, as the kernel's -10000 gives
    out = masked_kernel.forward(x, mask.to(torch.uint8), 0.5)
    assert out.dtype == dtype
    tol = {torch.float32: 1e-6, torch.float16: 1e-3, torch.bfloat16: 8e-3}[dtype]
    torch.testing.assert_close(out.double(), reference_masked(x, mask, 0.5), atol=tol, rtol=0)
    assert torch.allclose(out[0, :, 1].double(), torch.full((3, 6), 1 / 6, dtype=torch.float64), atol=tol)


def test_mask_broadcasts_over_batch():
    x = torch.randn(3, 2, 4, 4)
    mask = torch.triu(torch.ones(4, 4, dtype=torch.bool), 1)[None, None]
    torch.testing.assert_close(masked_kernel.forward(x, mask, 1.0).double(), reference_masked(x, mask, 1.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_causal_softmax_zeroes_the_future_exactly(dtype):
    x = torch.randn(5, 7, 7).to(dtype)
    out = causal_kernel.forward(x, 2.0)
    assert out.dtype == dtype
    assert (out.triu(1) == 0).all()
    tol = 1e-6 if dtype == torch.float32 else 1e-3
    torch.testing.assert_close(out.double(), reference_causal(x, 2.0), atol=tol, rtol=0)


def test_backward_is_the_softmax_jacobian_times_scale():
    """The kernels' backward, dx = scale * p * (dy - sum(dy * p)), equals autograd through the math."""
    x = torch.randn(2, 2, 4, 5, dtype=torch.float64, requires_grad=True)
    mask = torch.rand(2, 1, 4, 5) > 0.7
    mask[..., 0] = False  # in a fully masked row the kernel's formula and masked_fill's autograd differ (below)
    dy = torch.randn(2, 2, 4, 5, dtype=torch.float64)
    expected = torch.autograd.grad(torch.softmax((x * 0.3).masked_fill(mask, -10000.0), -1), x, dy)[0]
    ours = torch.autograd.grad(scaled_masked_softmax(x, mask, 0.3), x, dy)[0]
    torch.testing.assert_close(ours, expected)
    probs = masked_kernel.forward(x.detach(), mask, 0.3)
    torch.testing.assert_close(masked_kernel.backward(dy, probs, 0.3), expected)

    xc = torch.randn(3, 4, 4, dtype=torch.float64, requires_grad=True)
    dyc = torch.randn(3, 4, 4, dtype=torch.float64)
    causal = torch.ones(4, 4, dtype=torch.bool).triu(1)
    expected = torch.autograd.grad(torch.softmax((xc * 1.5).masked_fill(causal, float("-inf")), -1), xc, dyc)[0]
    torch.testing.assert_close(torch.autograd.grad(scaled_upper_triang_masked_softmax(xc, 1.5), xc, dyc)[0], expected)


def test_backward_formula_on_a_fully_masked_row():
    """The kernel applies its formula to every entry: a fully masked row (uniform p) gets
    scale * p * (dy - mean(dy)), not the zero gradient masked_fill's autograd would give."""
    mask = torch.ones(1, 1, 1, 4, dtype=torch.bool)
    p = masked_kernel.forward(torch.randn(1, 1, 1, 4, dtype=torch.float64), mask, 2.0)
    dy = torch.tensor([[[[1.0, 2.0, 3.0, 6.0]]]], dtype=torch.float64)
    expected = 2.0 * 0.25 * (dy - (dy * 0.25).sum())
    torch.testing.assert_close(masked_kernel.backward(dy, p, 2.0), expected)


def test_half_backward_leaves_the_incoming_gradient_alone():
    dy = torch.randn(1, 1, 2, 3)
    before = dy.clone()
    masked_kernel.backward(dy, torch.softmax(torch.randn(1, 1, 2, 3), -1), 1.0)
    assert torch.equal(dy, before)


def test_batch_per_block_is_the_kernels_launch_geometry():
    # 128 threads a block; warp = min(next pow2 of sk, 32); two rows a warp up to 128 columns.
    assert batch_per_block(128, 128, 4, 4) == 8
    assert batch_per_block(16, 16, 1, 1) == 16
    assert batch_per_block(512, 512, 1, 1) == 4
    assert masked_kernel.get_batch_per_block(64, 100, 2, 2) == 8


def _mask_func(scores, mask):
    return scores.masked_fill(mask, -10000.0)


@pytest.mark.parametrize("mask_type", [AttnMaskType.padding, AttnMaskType.causal])
def test_fused_scale_mask_softmax_fused_and_torch_paths_agree(mask_type):
    """fp16 input with fusion takes the kernel path (fp32 inside); the unfused path upcasts itself."""
    x = torch.randn(4, 2, 32, 32).half()  # 8 attention batches: a multiple of the kernel's 8 a block
    causal = torch.ones(32, 32, dtype=torch.bool).triu(1)[None, None].expand(4, 1, 32, 32)
    fused = FusedScaleMaskSoftmax(True, False, mask_type, True, _mask_func, True, 0.25)
    unfused = FusedScaleMaskSoftmax(True, False, mask_type, False, _mask_func, True, 0.25)
    assert fused.is_kernel_available(causal, 4, 2, 32, 32) and not unfused.is_kernel_available(causal, 4, 2, 32, 32)
    a, b = fused(x, causal), unfused(x, causal)
    assert a.dtype == b.dtype == torch.float16
    torch.testing.assert_close(a.float(), b.float(), atol=1e-3, rtol=0)
    if mask_type is AttnMaskType.causal:
        assert (a.triu(1) == 0).all()


def test_fused_scale_mask_softmax_refuses_what_megatron_refuses():
    with pytest.raises(ValueError, match="both"):
        FusedScaleMaskSoftmax(True, True, AttnMaskType.padding, True, _mask_func, True, None)
    with pytest.raises(ValueError, match="softmax_in_fp32"):
        FusedScaleMaskSoftmax(True, False, AttnMaskType.padding, True, _mask_func, False, 2.0)
