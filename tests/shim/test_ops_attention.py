"""fused_masked_attention (blocked CPU attention with dropout) and keep_mask, against the plain formula."""

import math

import pytest
import torch

import shim.nn.functional as F
from shim.ops.dropout_mask import apply_keep, keep_mask


def make_qkv(b=2, n=3, sq=6, sk=6, d=4, dtype=torch.float64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return tuple(
        torch.randn(b, n, s, d, generator=generator, dtype=torch.float64).to(dtype).requires_grad_()
        for s in (sq, sk, sk)
    )


def sep_visible(b, sq, sk, seed=0):
    """GLM's sep form: keys before sep visible to all, the rest causal; [b, 1, sq, sk]."""
    sep = torch.randint(1, sq, (b, 1, 1), generator=torch.Generator().manual_seed(seed))
    rows, cols = torch.arange(sq).view(1, -1, 1), torch.arange(sk).view(1, 1, -1)
    return ((cols <= rows + (sk - sq)) | (cols < sep)).unsqueeze(1)


def reference(q, k, v, visible, keep, p):
    """softmax(q k^T / sqrt(d) masked) -> drop -> / (1 - p) -> @ v, step by step."""
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.size(-1))
    probs = scores.masked_fill(~visible, float("-inf")).softmax(-1)
    return probs.masked_fill(~keep, 0.0) / (1 - p) @ v


@pytest.mark.parametrize("block_elements", [1, 50, 10_000])  # a block per head, a few heads, all at once
@pytest.mark.parametrize("mask_shape", ["batch", "shared", "2d"])
def test_matches_the_formula_with_the_same_mask_forward_and_backward(block_elements, mask_shape):
    b, n, sq, sk, p = 2, 3, 6, 8, 0.3
    q, k, v = make_qkv(b, n, sq, sk)
    visible = {"batch": sep_visible(b, sq, sk), "shared": sep_visible(1, sq, sk), "2d": sep_visible(1, sq, sk)[0, 0]}[
        mask_shape
    ]
    torch.manual_seed(11)
    out = F.fused_masked_attention(q, k, v, visible, p, block_elements=block_elements)
    torch.manual_seed(11)
    keep = keep_mask((b, n, sq, sk), p)  # the op's first draw
    refs = tuple(t.detach().clone().requires_grad_() for t in (q, k, v))
    expected = reference(*refs, visible, keep, p)
    torch.testing.assert_close(out, expected)
    grad = torch.randn(out.shape, dtype=out.dtype)
    out.backward(grad)
    expected.backward(grad)
    for got, want in zip((q, k, v), refs):
        torch.testing.assert_close(got.grad, want.grad)


def test_gradcheck_float64_under_a_fixed_seed():
    q, k, v = make_qkv(2, 2, 5, 7, 3)
    visible = sep_visible(2, 5, 7)

    def attend(*qkv):
        torch.manual_seed(5)
        return F.fused_masked_attention(*qkv, visible, 0.25, block_elements=40)

    assert torch.autograd.gradcheck(attend, (q, k, v))


def test_without_dropout_it_is_sdpa():
    q, k, v = make_qkv(dtype=torch.float32)
    visible = sep_visible(2, 6, 6)
    expected = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=visible)
    torch.testing.assert_close(F.fused_masked_attention(q, k, v, visible, 0.0), expected)


def test_same_seed_same_output_and_the_rate_scales_kept_weights():
    q, k, v = make_qkv(dtype=torch.float32)
    visible = sep_visible(2, 6, 6)
    outs = []
    for seed in (3, 3, 4):
        torch.manual_seed(seed)
        outs.append(F.fused_masked_attention(q, k, v, visible, 0.5))
    assert torch.equal(outs[0], outs[1]) and not torch.equal(outs[0], outs[2])


def test_a_row_with_no_visible_key_attends_uniformly_as_upstream():
    q, k, v = make_qkv(1, 1, 3, 4, 2)
    visible = torch.ones(3, 4, dtype=torch.bool)
    visible[1] = False
    torch.manual_seed(0)
    out = F.fused_masked_attention(q, k, v, visible, 1e-9)  # dropout on, so the blocked path runs
    torch.testing.assert_close(out[0, 0, 1], v[0, 0].mean(0))


def test_under_cpu_autocast_it_runs_in_the_lower_precision_as_sdpa_does():
    q, k, v = make_qkv(dtype=torch.float32)
    visible = sep_visible(2, 6, 6)
    torch.manual_seed(1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = F.fused_masked_attention(q, k, v, visible, 0.2)
    torch.manual_seed(1)
    expected = F.fused_masked_attention(*(t.detach().bfloat16() for t in (q, k, v)), visible, 0.2)
    assert out.dtype == torch.bfloat16 and torch.equal(out, expected)
    out.float().sum().backward()
    assert q.grad.dtype == torch.float32 and q.grad.abs().sum() > 0


def test_bfloat16_keeps_its_dtype():
    q, k, v = make_qkv(dtype=torch.bfloat16)
    out = F.fused_masked_attention(q, k, v, sep_visible(2, 6, 6), 0.1)
    out.sum().backward()
    assert out.dtype == q.grad.dtype == torch.bfloat16 and out.shape == q.shape


@pytest.mark.parametrize(
    "change, error, message",
    [
        ({"dropout_p": 1.5}, ValueError, r"dropout probability must be in \[0, 1\]"),
        ({"visible": torch.ones(6, 6)}, TypeError, "bool mask"),
        ({"k": torch.randn(2, 3, 6)}, ValueError, r"\[b, n, sq, d\]"),
    ],
)
def test_bad_input_is_one_clear_error(change, error, message):
    q, k, v = make_qkv(dtype=torch.float32)
    args = {"q": q, "k": k, "v": v, "visible": sep_visible(2, 6, 6), "dropout_p": 0.1} | change
    with pytest.raises(error, match=message):
        F.fused_masked_attention(**args)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_mask_rate_and_reproducibility(p):
    torch.manual_seed(0)
    mask = keep_mask((257, 255), p)  # an odd element count: half of the last 64-bit draw is unused
    torch.manual_seed(0)
    assert torch.equal(mask, keep_mask((257, 255), p))
    assert mask.dtype == torch.bool and mask.shape == (257, 255)
    assert abs(mask.float().mean().item() - (1 - p)) < 0.01  # 65535 draws: sd <= 0.002
    # independent across the two halves of a 64-bit draw
    pairs = mask.flatten()[:-1].view(-1, 2).float()
    assert abs((pairs[:, 0] * pairs[:, 1]).mean().item() - (1 - p) ** 2) < 0.01


def test_keep_mask_edges_are_exact():
    assert keep_mask((4, 5), 0.0).all()
    assert not keep_mask((4, 5), 1.0).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_apply_keep_zeroes_the_dropped_in_place_or_into_out(dtype):
    x = torch.randn(3, 4).to(dtype)
    keep = torch.rand(3, 4) < 0.5
    expected = x.masked_fill(~keep, 0.0)
    out = torch.empty_like(x)
    assert apply_keep(x, keep, out=out) is out and torch.equal(out, expected)
    assert apply_keep(x, keep) is x and torch.equal(x, expected)
