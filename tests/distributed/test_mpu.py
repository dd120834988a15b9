"""shim.mpu in the style of Megatron's own mpu tests: four gloo ranks, model parallel 2 x data parallel 2.

Each check builds the layer or runs the function on the model-parallel group and
compares against the same math done whole in one process.
"""

import contextlib

import pytest
import torch
import torch.distributed as dist

import shim.checkpointing
import shim.mpu as mpu

TOL = dict(rtol=1e-5, atol=1e-5)
WORLD = 4
MODEL_PARALLEL = 2


@contextlib.contextmanager
def model_parallel(size=MODEL_PARALLEL):
    mpu.initialize_model_parallel(size)
    try:
        yield
    finally:
        mpu.destroy_model_parallel()


def _same_on_every_rank(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def check_initialize_model_parallel():
    rank = dist.get_rank()
    with model_parallel():
        assert mpu.model_parallel_is_initialized()
        # Megatron's grouping: model-parallel groups [0, 1], [2, 3]; data-parallel groups [0, 2], [1, 3].
        assert mpu.get_model_parallel_world_size() == 2 and mpu.get_data_parallel_world_size() == 2
        assert mpu.get_model_parallel_rank() == rank % 2 and mpu.get_data_parallel_rank() == rank // 2
        assert mpu.get_model_parallel_src_rank() == rank // 2 * 2
        assert dist.get_world_size(mpu.get_model_parallel_group()) == 2
        assert dist.get_rank(mpu.get_data_parallel_group()) == rank // 2
        with pytest.raises(RuntimeError, match="already initialized"):
            mpu.initialize_model_parallel(2)
    assert not mpu.model_parallel_is_initialized()
    with pytest.raises(RuntimeError, match="not initialized"):
        mpu.get_model_parallel_group()
    with model_parallel(8):  # capped to the world size, as in Megatron
        assert mpu.get_model_parallel_world_size() == WORLD


def check_broadcast_data():
    with model_parallel():
        keys = ["text", "target", "empty"]
        data = {"text": torch.arange(12).view(3, 4), "target": torch.arange(5) * 7, "empty": torch.zeros(0, 2).long()}
        received = mpu.broadcast_data(keys, data if mpu.get_model_parallel_rank() == 0 else None, torch.int64)
        for key in keys:
            assert torch.equal(received[key], data[key])
        if mpu.get_model_parallel_rank() == 0:
            with pytest.raises(TypeError, match="'text' has dtype torch.int64, expected torch.float32"):
                mpu.broadcast_data(["text"], data, torch.float32)


def check_region_functions():
    with model_parallel():
        rank = mpu.get_model_parallel_rank()
        x = (_same_on_every_rank(2, 4, seed=1) + rank).requires_grad_()
        grad = _same_on_every_rank(2, 4, seed=2) * (rank + 1)

        mpu.copy_to_model_parallel_region(x).backward(grad)
        torch.testing.assert_close(x.grad, _same_on_every_rank(2, 4, seed=2) * 3, **TOL)  # summed over ranks
        x.grad = None

        out = mpu.reduce_from_model_parallel_region(x)
        torch.testing.assert_close(out, _same_on_every_rank(2, 4, seed=1) * 2 + 1, **TOL)
        out.backward(grad)
        torch.testing.assert_close(x.grad, grad)
        x.grad = None

        out = mpu.scatter_to_model_parallel_region(x)
        torch.testing.assert_close(out, x.detach().chunk(2, -1)[rank])
        out.backward(grad.chunk(2, -1)[rank])
        full = torch.cat([_same_on_every_rank(2, 4, seed=2).chunk(2, -1)[r] * (r + 1) for r in range(2)], -1)
        torch.testing.assert_close(x.grad, full, **TOL)
        x.grad = None

        out = mpu.gather_from_model_parallel_region(x)
        torch.testing.assert_close(out, torch.cat([_same_on_every_rank(2, 4, seed=1) + r for r in range(2)], -1))
        out.backward(torch.cat([grad, grad], -1))
        torch.testing.assert_close(x.grad, grad)


def check_column_parallel_linear():
    with model_parallel():
        rank = mpu.get_model_parallel_rank()
        torch.manual_seed(3)
        layer = mpu.ColumnParallelLinear(6, 8, keep_master_weight_for_test=True, gather_output=False)
        a = layer.master_weight
        assert torch.equal(layer.weight.to_local(), a.chunk(2)[rank])
        x = _same_on_every_rank(5, 6, seed=4).requires_grad_()
        y = layer(x)
        torch.testing.assert_close(y, (x @ a.t()).chunk(2, -1)[rank], **TOL)  # bias starts at zero
        dy = _same_on_every_rank(5, 8, seed=5)
        y.backward(dy.chunk(2, -1)[rank])
        torch.testing.assert_close(layer.weight.grad.to_local(), (dy.t() @ x.detach()).chunk(2)[rank], **TOL)
        torch.testing.assert_close(layer.bias.grad.to_local(), dy.sum(0).chunk(2)[rank], **TOL)
        torch.testing.assert_close(x.grad, dy @ a, **TOL)
        assert layer.weight.model_parallel


def check_column_parallel_linear_stride():
    with model_parallel():
        rank = mpu.get_model_parallel_rank()
        torch.manual_seed(6)
        qkv = mpu.ColumnParallelLinear(4, 12, stride=3, gather_output=False, keep_master_weight_for_test=True)
        q, k, v = qkv.master_weight.chunk(3)
        expected = torch.cat([q.chunk(2)[rank], k.chunk(2)[rank], v.chunk(2)[rank]])
        assert torch.equal(qkv.weight.to_local(), expected)  # Megatron's per-rank [q_r; k_r; v_r]


def check_row_parallel_linear():
    with model_parallel():
        rank = mpu.get_model_parallel_rank()
        torch.manual_seed(7)
        layer = mpu.RowParallelLinear(6, 4, input_is_parallel=True, keep_master_weight_for_test=True)
        a = layer.master_weight
        x = _same_on_every_rank(5, 6, seed=8).requires_grad_()
        y = layer(x.chunk(2, -1)[rank])
        torch.testing.assert_close(y, x @ a.t(), **TOL)
        dy = _same_on_every_rank(5, 4, seed=9)
        y.backward(dy)
        torch.testing.assert_close(layer.weight.grad.to_local(), (dy.t() @ x.detach()).chunk(2, 1)[rank], **TOL)
        torch.testing.assert_close(layer.bias.grad.full_tensor(), dy.sum(0), **TOL)
        torch.testing.assert_close(x.grad.chunk(2, -1)[rank], (dy @ a).chunk(2, -1)[rank], **TOL)


def check_vocab_parallel_embedding():
    with model_parallel():
        rank = mpu.get_model_parallel_rank()
        torch.manual_seed(10)
        layer = mpu.VocabParallelEmbedding(8, 3)
        table = layer.weight.full_tensor().detach()
        ids = torch.tensor([[0, 3, 4, 7], [7, 7, 1, 5]])
        y = layer(ids)
        torch.testing.assert_close(y, table[ids])
        dy = _same_on_every_rank(2, 4, 3, seed=11)
        y.backward(dy)
        expected = torch.zeros(8, 3).index_add_(0, ids.view(-1), dy.view(-1, 3))
        torch.testing.assert_close(layer.weight.grad.to_local(), expected.chunk(2)[rank], **TOL)


def check_parallel_embedding():
    with model_parallel():
        rank = mpu.get_model_parallel_rank()
        torch.manual_seed(17)
        layer = mpu.ParallelEmbedding(8, 6, keep_master_weight_for_test=True)
        table = layer.master_weight
        assert torch.equal(layer.weight.to_local(), table.chunk(2, dim=1)[rank])
        ids = torch.tensor([[0, 3, 4, 7], [7, 7, 1, 5]])
        y = layer(ids)
        torch.testing.assert_close(y, table[ids])
        dy = _same_on_every_rank(2, 4, 6, seed=18)
        y.backward(dy)
        expected = torch.zeros(8, 6).index_add_(0, ids.view(-1), dy.view(-1, 6))
        torch.testing.assert_close(layer.weight.grad.to_local(), expected.chunk(2, dim=1)[rank], **TOL)


def check_vocab_parallel_cross_entropy():
    with model_parallel():
        rank = mpu.get_model_parallel_rank()
        logits = _same_on_every_rank(4, 3, 10, seed=12) * 3
        target = torch.randint(0, 10, (4, 3), generator=torch.Generator().manual_seed(13))
        whole = logits.clone().requires_grad_()
        expected = torch.nn.functional.cross_entropy(whole.view(-1, 10), target.view(-1), reduction="none")
        expected.view(4, 3).mul(torch.arange(12.0).view(4, 3)).sum().backward()
        local = logits.chunk(2, -1)[rank].clone().requires_grad_()
        loss = mpu.vocab_parallel_cross_entropy(local, target)
        torch.testing.assert_close(loss, expected.view(4, 3), **TOL)
        loss.mul(torch.arange(12.0).view(4, 3)).sum().backward()
        torch.testing.assert_close(local.grad, whole.grad.chunk(2, -1)[rank], **TOL)


def check_clip_grad_norm():
    with model_parallel():
        torch.manual_seed(14)
        col = mpu.ColumnParallelLinear(4, 6, gather_output=False)
        norm_layer = torch.nn.LayerNorm(3)  # replicated: counted once
        col(_same_on_every_rank(2, 4, seed=15)).sum().backward()
        norm_layer(_same_on_every_rank(2, 3, seed=16)).pow(2).sum().backward()
        params = list(col.parameters()) + list(norm_layer.parameters())
        whole = [col.weight.grad.full_tensor(), col.bias.grad.full_tensor()] + [p.grad for p in norm_layer.parameters()]
        expected = torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in whole])).item()
        total = mpu.clip_grad_norm(params, max_norm=expected / 2)
        assert abs(total - expected) < 1e-5 * expected
        clipped = [col.weight.grad.full_tensor(), col.bias.grad.full_tensor()] + [p.grad for p in norm_layer.parameters()]
        clipped_norm = torch.linalg.vector_norm(torch.cat([g.reshape(-1) for g in clipped])).item()
        assert abs(clipped_norm - expected / 2) < 1e-4 * expected
        inf_norm = mpu.clip_grad_norm(params, max_norm=1e9, norm_type=float("inf"))
        assert inf_norm == pytest.approx(max(g.abs().max().item() for g in clipped), rel=1e-6)


def check_model_parallel_seed_and_checkpoint():
    with model_parallel():
        rank = mpu.get_model_parallel_rank()
        mpu.model_parallel_cuda_manual_seed(123)
        with mpu.get_cuda_rng_tracker().fork():
            tracked = torch.rand(3)
        torch.manual_seed(123 + 2718 + rank)  # a different stream on each model-parallel rank
        assert torch.equal(tracked, torch.rand(3))
        assert mpu.checkpoint is shim.checkpointing.checkpoint


CHECKS = {name[len("check_"):]: fn for name, fn in globals().items() if name.startswith("check_")}


@pytest.fixture(scope="module")
def four_ranks(launch):
    return launch(CHECKS, world_size=WORLD)


@pytest.mark.parametrize("name", list(CHECKS))
def test_on_four_ranks(four_ranks, name):
    four_ranks.assert_passed(name)


def test_utils():
    assert mpu.divide(12, 4) == 3
    with pytest.raises(ValueError, match="12 is not divisible by 5"):
        mpu.divide(12, 5)
    parts = mpu.split_tensor_along_last_dim(torch.arange(12).view(2, 6), 3)
    assert [p.tolist() for p in parts] == [[[0, 1], [6, 7]], [[2, 3], [8, 9]], [[4, 5], [10, 11]]]
    assert all(p.is_contiguous() for p in mpu.split_tensor_along_last_dim(torch.ones(2, 6), 2, True))
    assert mpu.VocabUtility.vocab_range_from_global_vocab_size(10, 1, 2) == (5, 10)
    assert issubclass(mpu.LayerNorm, torch.nn.LayerNorm)


def test_one_process_without_launcher(world_of_one):
    with model_parallel(1):
        assert mpu.get_model_parallel_world_size() == 1 and mpu.get_data_parallel_rank() == 0
        layer = mpu.ColumnParallelLinear(4, 6)
        x = torch.randn(2, 4)
        torch.testing.assert_close(layer(x), x @ layer.weight.t())
        assert torch.equal(mpu.gather_from_model_parallel_region(x), x)
