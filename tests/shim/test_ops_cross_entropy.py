"""sparse_softmax_cross_entropy: values and gradients against the composed formula, dtypes, errors, dispatch."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import shim.nn.functional as F
from shim.ops import cross_entropy, softmax_rows


def mpu_formula(logits, labels):
    """The upstream composition as plain autograd: max, subtract, exp, sum, log, gather."""
    shifted = logits - logits.max(dim=-1, keepdim=True).values
    return shifted.exp().sum(dim=-1).log() - shifted.gather(-1, labels[..., None]).squeeze(-1)


def loss_and_grad(fn, logits, labels, weights):
    logits = logits.detach().requires_grad_()
    loss = fn(logits, labels)
    (loss * weights).sum().backward()
    return loss.detach(), logits.grad


def make_inputs(shape=(3, 5), vocab=97, dtype=torch.float32, seed=0):
    generator = torch.Generator().manual_seed(seed)
    logits = (4 * torch.randn(*shape, vocab, generator=generator, dtype=torch.float64)).to(dtype)
    labels = torch.randint(0, vocab, shape, generator=generator)
    weights = torch.rand(shape, generator=generator, dtype=torch.float64)
    return logits, labels, weights


def test_gradcheck_float64():
    logits, labels, _ = make_inputs(shape=(4,), vocab=7, dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda x: F.sparse_softmax_cross_entropy(x, labels), (logits.requires_grad_(),)
    )


def test_float64_matches_formula_exactly_enough():
    logits, labels, weights = make_inputs(dtype=torch.float64)
    loss, grad = loss_and_grad(F.sparse_softmax_cross_entropy, logits, labels, weights)
    ref_loss, ref_grad = loss_and_grad(mpu_formula, logits, labels, weights)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-12, atol=1e-12)


def test_float32_against_float64_reference():
    logits, labels, weights = make_inputs(dtype=torch.float32)
    loss, grad = loss_and_grad(F.sparse_softmax_cross_entropy, logits, labels, weights.float())
    ref_loss, ref_grad = loss_and_grad(mpu_formula, logits.double(), labels, weights)
    assert loss.dtype == grad.dtype == torch.float32
    torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(grad.double(), ref_grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_logits_use_fp32_math(dtype):
    logits, labels, weights = make_inputs(dtype=dtype)
    loss, grad = loss_and_grad(F.sparse_softmax_cross_entropy, logits, labels, weights.float())
    # reference: the same (already rounded) logits, all math in fp64
    ref_loss, ref_grad = loss_and_grad(mpu_formula, logits.double(), labels, weights)
    assert loss.dtype == torch.float32 and grad.dtype == dtype
    torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-6, atol=1e-5)  # fp32-accurate, not half-accurate
    torch.testing.assert_close(grad.double(), ref_grad, rtol=0, atol=torch.finfo(dtype).eps)


def test_blocks_with_a_partial_last_block(monkeypatch):
    # 15 rows in blocks of 4 (the last one holds 3)
    monkeypatch.setattr(softmax_rows, "_BLOCK_ELEMENTS", 4 * 97)
    logits, labels, weights = make_inputs(dtype=torch.bfloat16)
    loss, grad = loss_and_grad(F.sparse_softmax_cross_entropy, logits, labels, weights.float())
    ref_loss, ref_grad = loss_and_grad(mpu_formula, logits.double(), labels, weights)
    torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(grad.double(), ref_grad, rtol=0, atol=torch.finfo(torch.bfloat16).eps)


def test_glm_reduction_and_non_contiguous_logits():
    logits, labels, weights = make_inputs(shape=(5, 3), dtype=torch.float32)
    transposed = logits.transpose(0, 1).contiguous().transpose(0, 1)  # same values, other strides
    mask = (weights > 0.3).float()
    x = transposed.detach().requires_grad_()
    loss = (F.sparse_softmax_cross_entropy(x, labels) * mask).sum() / mask.sum()
    loss.backward()
    y = logits.double().requires_grad_()
    ref = (mpu_formula(y, labels) * mask.double()).sum() / mask.sum()
    ref.backward()
    torch.testing.assert_close(loss.double(), ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(x.grad.double(), y.grad, rtol=1e-5, atol=1e-7)


def test_no_positions():
    logits = torch.randn(0, 11, requires_grad=True)
    loss = F.sparse_softmax_cross_entropy(logits, torch.zeros(0, dtype=torch.long))
    loss.sum().backward()
    assert loss.shape == (0,) and logits.grad.shape == (0, 11)


def test_int32_labels_accepted():
    logits, labels, _ = make_inputs()
    torch.testing.assert_close(
        F.sparse_softmax_cross_entropy(logits, labels.int()), F.sparse_softmax_cross_entropy(logits, labels)
    )


def test_fp32_graph_is_backpropagated_once():
    logits, labels, _ = make_inputs()
    loss = F.sparse_softmax_cross_entropy(logits.requires_grad_(), labels).sum()
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss.backward()


@pytest.mark.parametrize(
    "logits, labels, error, message",
    [
        (torch.randn(2, 5), torch.tensor([0, 5]), ValueError, "label 5 out of range for vocab size 5"),
        (torch.randn(2, 5), torch.tensor([-1, 0]), ValueError, "label -1 out of range"),
        (torch.randn(2, 5), torch.tensor([0, 1, 2]), ValueError, r"labels shape \(3,\) must equal .* \(2,\)"),
        (torch.randn(2, 3, 5), torch.tensor([0, 1]), ValueError, "labels shape"),
        (torch.randint(0, 5, (2, 5)), torch.tensor([0, 1]), TypeError, "logits must be floating point"),
        (torch.randn(2, 5), torch.tensor([0.0, 1.0]), TypeError, "labels must be an integer tensor"),
        (torch.randn(2, 5), torch.tensor([True, False]), TypeError, "labels must be an integer tensor"),
        (torch.randn(2, 0), torch.tensor([0, 0]), ValueError, "non-empty last"),
    ],
)
def test_bad_input_is_one_clear_error(logits, labels, error, message):
    with pytest.raises(error, match=message):
        F.sparse_softmax_cross_entropy(logits, labels)


class FakeGroup:
    def __init__(self, size):
        self._size = size

    def size(self):
        return self._size


@pytest.fixture
def vocab_parallel_calls(monkeypatch):
    """Stand in for the vocab-parallel op and record what it is given."""
    calls = []

    def vocab_parallel_sparse_softmax_cross_entropy(local_logits, labels, group):
        calls.append((local_logits, labels, group))
        return torch.zeros(labels.shape)

    monkeypatch.setattr(
        cross_entropy, "vocab_parallel_sparse_softmax_cross_entropy", vocab_parallel_sparse_softmax_cross_entropy
    )
    return calls


def test_group_of_one_computes_locally(vocab_parallel_calls):
    logits, labels, _ = make_inputs()
    torch.testing.assert_close(
        F.sparse_softmax_cross_entropy(logits, labels, process_group=FakeGroup(1)),
        F.sparse_softmax_cross_entropy(logits, labels),
    )
    assert vocab_parallel_calls == []


def test_larger_group_delegates_to_vocab_parallel(vocab_parallel_calls):
    logits, labels, _ = make_inputs()
    group = FakeGroup(2)
    # a label beyond this shard's vocab is a valid global id: no range check here
    F.sparse_softmax_cross_entropy(logits, labels + 97, process_group=group)
    ((local_logits, passed_labels, passed_group),) = vocab_parallel_calls
    assert local_logits is logits and passed_group is group
    assert torch.equal(passed_labels, labels + 97)


def test_larger_group_still_checks_shapes(vocab_parallel_calls):
    with pytest.raises(ValueError, match="labels shape"):
        F.sparse_softmax_cross_entropy(torch.randn(2, 5), torch.tensor([0]), process_group=FakeGroup(2))
    assert vocab_parallel_calls == []


@pytest.fixture
def mesh_of_one():
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def test_vocab_sharded_dtensor_delegates_with_its_mesh_group(mesh_of_one, vocab_parallel_calls):
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    logits, labels, _ = make_inputs()
    sharded = distribute_tensor(logits, mesh_of_one, [Shard(-1)])
    F.sparse_softmax_cross_entropy(sharded, distribute_tensor(labels, mesh_of_one, [Replicate()]))
    ((local_logits, passed_labels, group),) = vocab_parallel_calls
    assert torch.equal(local_logits, sharded.to_local()) and torch.equal(passed_labels, labels)
    assert group is mesh_of_one.get_group(0)

    with pytest.raises(ValueError, match="must be sharded on the vocab"):
        F.sparse_softmax_cross_entropy(distribute_tensor(logits, mesh_of_one, [Replicate()]), labels)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_logsumexp_kernel_on_extreme_rows(dtype, monkeypatch):
    # the local step the vocab-parallel op builds on; rows far apart in scale, blocks of 2 rows
    monkeypatch.setattr(softmax_rows, "_BLOCK_ELEMENTS", 2 * 50)
    logits = torch.randn(5, 50, dtype=torch.float64) * torch.tensor([1.0, 30.0, 1e3, 1e-3, 80.0])[:, None]
    logits[2, 7] = 5e3
    logits = logits.to(dtype)
    expected = torch.logsumexp(logits.double(), dim=1)
    torch.testing.assert_close(softmax_rows.logsumexp_rows(logits).double(), expected, rtol=1e-6, atol=1e-5)


@settings(max_examples=30, deadline=None)
@given(
    rows=st.integers(1, 9),
    vocab=st.integers(1, 300),
    scale=st.sampled_from([1e-3, 1.0, 50.0]),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float64]),
    rows_per_block=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_any_shape_scale_and_blocking_matches_formula(rows, vocab, scale, dtype, rows_per_block, seed):
    generator = torch.Generator().manual_seed(seed)
    logits = (scale * torch.randn(rows, vocab, generator=generator, dtype=torch.float64)).to(dtype)
    labels = torch.randint(0, vocab, (rows,), generator=generator)
    weights = torch.rand(rows, generator=generator, dtype=torch.float64)
    original = softmax_rows._BLOCK_ELEMENTS
    softmax_rows._BLOCK_ELEMENTS = rows_per_block * vocab
    try:
        loss_weights = weights if dtype == torch.float64 else weights.float()
        loss, grad = loss_and_grad(F.sparse_softmax_cross_entropy, logits, labels, loss_weights)
    finally:
        softmax_rows._BLOCK_ELEMENTS = original
    ref_loss, ref_grad = loss_and_grad(mpu_formula, logits.double(), labels, weights)
    grad_tol = torch.finfo(dtype).eps if dtype != torch.float64 else 1e-12
    torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-6, atol=1e-5 * scale)
    torch.testing.assert_close(grad.double(), ref_grad, rtol=0, atol=grad_tol)
