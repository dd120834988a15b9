"""fused_bias_add_dropout: dropout(x + bias) (+ residual), determinism, identities, gradients."""

import pytest
import torch

import shim.nn.functional as F


def make_inputs(dtype=torch.float32, shape=(8, 6, 32), seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=generator, dtype=torch.float64).to(dtype).requires_grad_()
    bias = torch.randn(shape[-1], generator=generator, dtype=torch.float64).to(dtype).requires_grad_()
    residual = torch.randn(*shape, generator=generator, dtype=torch.float64).to(dtype).requires_grad_()
    return x, bias, residual


def seeded(seed, *args, **kwargs):
    torch.manual_seed(seed)
    return F.fused_bias_add_dropout(*args, **kwargs)


def test_gradcheck_float64_under_a_fixed_seed():
    x, bias, residual = make_inputs(torch.float64, shape=(5, 4))
    assert torch.autograd.gradcheck(lambda a, b, r: seeded(1, a, b, 0.3, True, r), (x, bias, residual))


def test_same_seed_same_mask_other_seed_other_mask():
    x, bias, _ = make_inputs()
    first, again, other = seeded(3, x, bias, 0.5), seeded(3, x, bias, 0.5), seeded(4, x, bias, 0.5)
    assert torch.equal(first, again)
    assert not torch.equal(first, other)


def test_kept_values_are_scaled_and_the_rate_is_p():
    x, bias, _ = make_inputs(shape=(64, 256))
    p = 0.25
    out = seeded(0, x, bias, p)
    kept = out != 0
    torch.testing.assert_close(out[kept], ((x + bias) / (1 - p))[kept])
    assert abs(kept.float().mean().item() - (1 - p)) < 0.01  # 16384 draws: sd ~ 0.0034


def test_gradients_follow_the_mask():
    x, bias, residual = make_inputs()
    p = 0.4
    grad = torch.randn(x.shape)
    out = seeded(5, x, bias, p, residual=residual)
    out.backward(grad)
    keep = seeded(5, x, bias, p) != 0
    expected = grad * keep / (1 - p)
    torch.testing.assert_close(x.grad, expected)
    torch.testing.assert_close(bias.grad, expected.sum((0, 1)))
    torch.testing.assert_close(residual.grad, grad)


def test_residual_is_added_after_dropout():
    x, bias, residual = make_inputs()
    torch.testing.assert_close(seeded(7, x, bias, 0.3, residual=residual), seeded(7, x, bias, 0.3) + residual)


def test_bfloat16_keeps_its_dtype():
    x, bias, residual = make_inputs(torch.bfloat16)
    out = seeded(2, x, bias, 0.1, residual=residual)
    assert out.dtype == torch.bfloat16 and out.shape == x.shape


@pytest.mark.parametrize("p, training", [(0.0, True), (0.5, False)])
def test_identity_without_dropout_consumes_no_randomness(p, training):
    x, bias, residual = make_inputs()
    torch.manual_seed(9)
    out = F.fused_bias_add_dropout(x, bias, p, training=training, residual=residual)
    after = torch.rand(1)
    torch.manual_seed(9)
    assert torch.equal(torch.rand(1), after)
    torch.testing.assert_close(out, x + bias + residual, rtol=0, atol=0)


def test_p_one_drops_everything():
    x, bias, residual = make_inputs()
    torch.testing.assert_close(seeded(0, x, bias, 1.0), torch.zeros_like(x), rtol=0, atol=0)
    torch.testing.assert_close(seeded(0, x, bias, 1.0, residual=residual), residual, rtol=0, atol=0)


@pytest.mark.parametrize(
    "p, residual, error, message",
    [
        (1.5, None, ValueError, r"dropout probability must be in \[0, 1\], got 1.5"),
        (-0.1, None, ValueError, "dropout probability"),
        (0.1, torch.randn(4, 7), ValueError, "residual"),
        (0.1, torch.randn(4, 8, dtype=torch.float64), ValueError, "residual"),
    ],
)
def test_bad_input_is_one_clear_error(p, residual, error, message):
    with pytest.raises(error, match=message):
        F.fused_bias_add_dropout(torch.randn(4, 8), torch.randn(8), p, residual=residual)
