"""Global tensors, Linear1D, VocabParallelEmbedding and the vocab-parallel cross entropy on two
gloo ranks give the values and gradients of one process (fp32, 1e-5)."""

import contextlib

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st

import shim
import shim.distributed as sdist
import shim.nn.functional as F
from shim import sbp
from shim.global_tensor import is_global
from shim.ops.vocab_parallel_cross_entropy import vocab_parallel_sparse_softmax_cross_entropy

TOL = dict(rtol=1e-5, atol=1e-5)


@contextlib.contextmanager
def tensor_parallel(size=2):
    sdist.setup_layout(tensor_parallel_size=size)
    try:
        yield
    finally:
        sdist.reset_layout()


def _same_on_every_rank(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def check_global_tensor_split_broadcast_partial():
    rank = dist.get_rank()
    ranks = shim.placement("cuda", [0, 1])  # "cuda" means the CPU here
    piece = torch.full((2, 3), float(rank))
    split = shim.to_global(piece, placement=ranks, sbp=sbp.split(0))
    assert split.shape == (4, 3) and torch.equal(shim.to_local(split), piece)
    whole = shim.to_global(split, sbp=sbp.broadcast)
    assert torch.equal(shim.to_local(whole), torch.tensor([0.0, 1.0]).repeat_interleave(2)[:, None].expand(4, 3))
    summed = shim.to_global(shim.to_global(piece, placement=ranks, sbp=sbp.partial_sum), sbp=sbp.broadcast)
    assert torch.equal(shim.to_local(summed), torch.ones(2, 3))
    grid = shim.placement("cpu", [[0, 1]])
    assert grid.mesh.shape == (1, 2)
    both = shim.to_global(piece, placement=grid, sbp=[sbp.broadcast, sbp.split(1)])
    assert both.shape == (2, 6)
    with pytest.raises(ValueError, match="one shim.sbp value per placement dim"):
        shim.to_global(piece, placement=grid, sbp=sbp.split(0))


def check_global_tensor_methods():
    from shim.global_tensor import disable_tensor_methods, enable_tensor_methods

    enable_tensor_methods()
    try:
        ranks = shim.placement("cpu", [0, 1])
        x = torch.ones(2).to_global(placement=ranks, sbp=sbp.split(0))
        assert x.is_global and x.sbp == (sbp.split(0),) and x.placement is ranks
        assert torch.equal(x.to_global(sbp=sbp.broadcast).to_local(), torch.ones(4))
    finally:
        disable_tensor_methods()
    assert not hasattr(torch.ones(1), "to_global")


def _compare_linear(parallel, **kwargs):
    torch.manual_seed(1)
    reference = torch.nn.Linear(8, 6)
    torch.manual_seed(1)
    layer = shim.nn.Linear1D(8, 6, parallel=parallel, **kwargs)
    rank = dist.get_rank()
    x = _same_on_every_rank(5, 8, seed=2).requires_grad_()
    x_ref = x.detach().clone().requires_grad_()
    row_input_is_parallel = parallel == "row" and kwargs.get("input_is_parallel", True)
    if row_input_is_parallel:
        out = layer(x.chunk(2, dim=-1)[rank])
    else:
        out = layer(x)
    expected = reference(x_ref)
    if parallel == "col" and not kwargs.get("gather_output", False):
        expected_out = expected.chunk(2, dim=-1)[rank]
    else:
        expected_out = expected
    torch.testing.assert_close(out, expected_out, **TOL)
    weights = _same_on_every_rank(*expected.shape, seed=3)
    (out * (weights.chunk(2, -1)[rank] if out.shape != expected.shape else weights)).sum().backward()
    (expected * weights).sum().backward()
    shard_dim = {"col": 0, "row": 1}[parallel]
    torch.testing.assert_close(
        layer.weight.grad.to_local(), reference.weight.grad.chunk(2, dim=shard_dim)[rank], **TOL
    )
    bias_grad = layer.bias.grad.to_local() if parallel == "col" else layer.bias.grad.full_tensor()
    expected_bias = reference.bias.grad.chunk(2)[rank] if parallel == "col" else reference.bias.grad
    torch.testing.assert_close(bias_grad, expected_bias, **TOL)
    if row_input_is_parallel:
        # only this rank's slice of x fed the layer
        torch.testing.assert_close(x.grad.chunk(2, -1)[rank], x_ref.grad.chunk(2, -1)[rank], **TOL)
    else:
        torch.testing.assert_close(x.grad, x_ref.grad, **TOL)


def check_linear_col():
    with tensor_parallel():
        _compare_linear("col")


def check_linear_col_gathered():
    with tensor_parallel():
        _compare_linear("col", gather_output=True)


def check_linear_row():
    with tensor_parallel():
        _compare_linear("row")


def check_linear_row_scatters_whole_input():
    with tensor_parallel():
        _compare_linear("row", input_is_parallel=False)


def check_col_then_row_mlp():
    with tensor_parallel():
        torch.manual_seed(4)
        ref_up, ref_down = torch.nn.Linear(8, 16), torch.nn.Linear(16, 8)
        torch.manual_seed(4)
        up, down = shim.nn.Linear1D(8, 16, parallel="col"), shim.nn.Linear1D(16, 8, parallel="row")
        x = _same_on_every_rank(3, 8, seed=5)
        out = down(F.gelu(up(x), approximate="tanh"))
        expected = ref_down(F.gelu(ref_up(x), approximate="tanh"))
        torch.testing.assert_close(out, expected, **TOL)
        out.square().sum().backward()
        expected.square().sum().backward()
        rank = dist.get_rank()
        torch.testing.assert_close(up.weight.grad.to_local(), ref_up.weight.grad.chunk(2)[rank], **TOL)
        torch.testing.assert_close(down.weight.grad.to_local(), ref_down.weight.grad.chunk(2, 1)[rank], **TOL)


def check_vocab_parallel_embedding():
    with tensor_parallel():
        torch.manual_seed(6)
        reference = torch.nn.Embedding(10, 4)
        torch.manual_seed(6)
        layer = shim.nn.VocabParallelEmbedding(10, 4)
        ids = torch.tensor([[0, 4, 5, 9], [9, 5, 1, 1]])
        out = layer(ids)
        expected = reference(ids)
        torch.testing.assert_close(out, expected, **TOL)
        weights = _same_on_every_rank(2, 4, 4, seed=7)
        (out * weights).sum().backward()
        (expected * weights).sum().backward()
        rank = dist.get_rank()
        torch.testing.assert_close(layer.weight.grad.to_local(), reference.weight.grad.chunk(2)[rank], **TOL)


def _cross_entropy_case():
    logits = _same_on_every_rank(3, 5, 12, seed=8) * 4
    labels = torch.randint(0, 12, (3, 5), generator=torch.Generator().manual_seed(9))
    labels[0, :2] = torch.tensor([0, 11])  # first and last vocab ids: one on each rank
    grad_weights = _same_on_every_rank(3, 5, seed=10)
    reference_logits = logits.clone().requires_grad_()
    expected = torch.nn.functional.cross_entropy(
        reference_logits.view(-1, 12), labels.view(-1), reduction="none"
    ).view(3, 5)
    (expected * grad_weights).sum().backward()
    return logits, labels, grad_weights, expected, reference_logits.grad


def check_vocab_parallel_cross_entropy():
    rank, group = dist.get_rank(), dist.group.WORLD
    logits, labels, grad_weights, expected, expected_grad = _cross_entropy_case()
    local = logits.chunk(2, dim=-1)[rank].clone().requires_grad_()
    loss = vocab_parallel_sparse_softmax_cross_entropy(local, labels, group)
    torch.testing.assert_close(loss, expected, **TOL)
    (loss * grad_weights).sum().backward()
    torch.testing.assert_close(local.grad, expected_grad.chunk(2, dim=-1)[rank], **TOL)


def check_cross_entropy_through_functional_and_dtensor():
    rank = dist.get_rank()
    logits, labels, grad_weights, expected, expected_grad = _cross_entropy_case()
    local = logits.chunk(2, dim=-1)[rank].clone().requires_grad_()
    loss = F.sparse_softmax_cross_entropy(local, labels, process_group=dist.group.WORLD)
    torch.testing.assert_close(loss, expected, **TOL)
    sharded = shim.to_global(local, placement=shim.placement("cpu", [0, 1]), sbp=sbp.split(-1))
    loss = F.sparse_softmax_cross_entropy(sharded, labels)
    torch.testing.assert_close(loss, expected, **TOL)
    (loss * grad_weights).sum().backward()
    torch.testing.assert_close(local.grad, expected_grad.chunk(2, dim=-1)[rank], **TOL)


def check_tied_output_logits_stay_vocab_sharded():
    """Embedding -> hidden -> logits with the same (vocab-split) table -> loss, no gather of the logits."""
    from torch.distributed.tensor import DTensor, Replicate

    with tensor_parallel():
        torch.manual_seed(11)
        reference = torch.nn.Embedding(12, 4)
        torch.manual_seed(11)
        embedding = shim.nn.VocabParallelEmbedding(12, 4)
        ids = torch.tensor([[1, 5, 6, 11], [0, 0, 7, 3]])
        labels = torch.tensor([[5, 6, 11, 0], [0, 7, 3, 9]])

        hidden = torch.tanh(embedding(ids))
        # the hidden states are whole on every rank; their gradient comes back summed
        replicated = DTensor.from_local(hidden, embedding.weight.device_mesh, [Replicate()])
        logits = torch.nn.functional.linear(replicated, embedding.weight)  # Shard(-1): this rank's vocab slice
        assert logits.placements[0].is_shard(dim=2) and logits.to_local().shape == (2, 4, 6)
        loss = F.sparse_softmax_cross_entropy(logits, labels)

        ref_hidden = torch.tanh(reference(ids))
        ref_loss = torch.nn.functional.cross_entropy(
            torch.nn.functional.linear(ref_hidden, reference.weight).view(-1, 12), labels.view(-1), reduction="none"
        ).view(2, 4)
        torch.testing.assert_close(loss, ref_loss, **TOL)
        loss.sum().backward()
        ref_loss.sum().backward()
        rank = dist.get_rank()
        torch.testing.assert_close(embedding.weight.grad.to_local(), reference.weight.grad.chunk(2)[rank], **TOL)


def check_cross_entropy_half_logits_do_fp32_math():
    rank = dist.get_rank()
    logits, labels, _, _, _ = _cross_entropy_case()
    half = logits.bfloat16()
    expected = torch.nn.functional.cross_entropy(half.float().view(-1, 12), labels.view(-1), reduction="none")
    loss = vocab_parallel_sparse_softmax_cross_entropy(half.chunk(2, -1)[rank].contiguous(), labels, dist.group.WORLD)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss.view(-1), expected, **TOL)


def check_bad_sizes_fail_before_collectives():
    with tensor_parallel():
        with pytest.raises(ValueError, match=r"out_features \(7\) is not divisible by tensor_parallel_size \(2\)"):
            shim.nn.Linear1D(4, 7, parallel="col")
        with pytest.raises(ValueError, match=r"num_embeddings \(11\) is not divisible"):
            shim.nn.VocabParallelEmbedding(11, 4)
    with pytest.raises(ValueError, match="label 12 out of range for vocab size 12"):
        vocab_parallel_sparse_softmax_cross_entropy(torch.zeros(2, 6), torch.tensor([0, 12]), dist.group.WORLD)


CHECKS = {name[len("check_"):]: fn for name, fn in globals().items() if name.startswith("check_")}


@pytest.fixture(scope="module")
def two_ranks(launch):
    return launch(CHECKS)


@pytest.mark.parametrize("name", list(CHECKS))
def test_on_two_ranks(two_ranks, name):
    two_ranks.assert_passed(name)


def test_linear1d_rejects_unknown_mode():
    with pytest.raises(ValueError, match="parallel='diagonal'"):
        shim.nn.Linear1D(4, 4, parallel="diagonal")


def test_global_tensors_in_a_world_of_one(world_of_one):
    ranks = shim.placement("cuda")
    assert ranks is shim.placement("cpu", [0])  # cached; "cuda" means the active device
    x = shim.to_global(torch.arange(6.0).view(2, 3), placement=ranks, sbp=sbp.split(1))
    assert is_global(x) and x.shape == (2, 3)
    assert torch.equal(shim.to_local(shim.to_global(x, sbp=sbp.broadcast)), torch.arange(6.0).view(2, 3))
    assert shim.to_local(torch.ones(1)).shape == (1,)


def test_placement_and_to_global_errors(world_of_one):
    with pytest.raises(ValueError, match=r"must be distinct ranks in \[0, 1\)"):
        shim.placement("cpu", [0, 0])
    with pytest.raises(ValueError, match="needs both placement= and sbp="):
        shim.to_global(torch.ones(2), sbp=sbp.broadcast)
    x = shim.to_global(torch.ones(2), placement=shim.placement("cpu"), sbp=sbp.broadcast)
    other = shim.placement("cpu", [[0]])
    with pytest.raises(ValueError, match="cannot move a global tensor to another placement"):
        shim.to_global(x, placement=other, sbp=[sbp.broadcast, sbp.broadcast])


@settings(max_examples=25, deadline=None)
@given(
    shape=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    vocab=st.integers(1, 40),
    scale=st.floats(0.1, 30.0),
    seed=st.integers(0, 2**16),
)
def test_one_rank_vocab_parallel_matches_torch(shape, vocab, scale, seed):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(*shape, vocab, generator=g) * scale).requires_grad_()
    labels = torch.randint(0, vocab, shape, generator=g)
    loss = vocab_parallel_sparse_softmax_cross_entropy(logits, labels, sdist.SingleProcessGroup())
    reference_logits = logits.detach().clone().requires_grad_()
    expected = torch.nn.functional.cross_entropy(
        reference_logits.view(-1, vocab), labels.view(-1), reduction="none"
    ).view(shape)
    torch.testing.assert_close(loss, expected, **TOL)
    weights = torch.rand(shape, generator=g)
    (loss * weights).sum().backward()
    (expected * weights).sum().backward()
    torch.testing.assert_close(logits.grad, reference_logits.grad, **TOL)
