"""shim.distributed: one process without a process group, a world of one, and two gloo ranks."""

import copy

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
import torch.distributed as dist

import shim.distributed as sdist


# --- no process group at all: world-of-one meanings -------------------------------------------

def test_torch_names_forward():
    assert sdist.ReduceOp is dist.ReduceOp
    assert sdist.TCPStore is dist.TCPStore
    assert sdist.is_initialized is dist.is_initialized


def test_own_names_resolve_to_their_objects_after_submodule_imports():
    import importlib
    import pkgutil
    import types

    own = set(sdist.__all__) - {n for n in dir(dist) if not n.startswith("_")}
    assert {"all_reduce_flat", "setup_layout", "stage_layers"} <= own
    for module in pkgutil.iter_modules(sdist.__path__, "shim.distributed."):
        importlib.import_module(module.name)  # importing a submodule must not shadow a public name
    for name in own:
        assert not isinstance(getattr(sdist, name), types.ModuleType), name


def test_collectives_without_process_group_are_identities():
    assert not dist.is_initialized()
    assert sdist.get_rank() == 0 and sdist.get_world_size() == 1
    x = torch.arange(4.0)
    sdist.all_reduce(x, op=sdist.ReduceOp.MAX)
    sdist.broadcast(x, 0)
    sdist.reduce(x, 0)
    sdist.barrier()
    assert torch.equal(x, torch.arange(4.0))
    gathered = [torch.zeros(4)]
    sdist.all_gather(gathered, x)
    assert torch.equal(gathered[0], x)
    out = torch.zeros(4)
    sdist.reduce_scatter_tensor(out, x)
    assert torch.equal(out, x)
    objects = [None]
    sdist.all_gather_object(objects, {"a": 1})
    assert objects == [{"a": 1}]
    assert sdist.all_reduce(x, async_op=True).wait()


def test_new_group_without_process_group():
    group = sdist.new_group([0])
    assert sdist.get_world_size(group=group) == 1 and sdist.get_rank(group=group) == 0
    x = torch.ones(2)
    sdist.all_reduce(x, group=group)
    assert torch.equal(x, torch.ones(2))
    with pytest.raises(ValueError, match=r"new_group\(ranks=\[0, 1\]\)"):
        sdist.new_group([0, 1])


def test_ddp_in_one_process_is_transparent():
    model = torch.nn.Linear(3, 2)
    wrapped = sdist.DistributedDataParallel(model, device_ids=[0], output_device=0)
    assert wrapped.module is model
    assert isinstance(wrapped, sdist.DistributedDataParallel)
    assert list(wrapped.state_dict()) == ["module.weight", "module.bias"]
    x = torch.randn(4, 3)
    with wrapped.no_sync():
        assert torch.equal(wrapped(x), model(x))
    clone = copy.deepcopy(wrapped)
    assert isinstance(clone, sdist.DistributedDataParallel) and torch.equal(clone(x), model(x))


def test_world_of_one_needs_no_launcher(world_of_one):
    # the fixture initialised without MASTER_ADDR/MASTER_PORT: an in-memory store
    assert dist.is_initialized() and sdist.get_world_size() == 1
    x = torch.ones(2)
    sdist.all_reduce(x)
    assert torch.equal(x, torch.ones(2))


def test_nccl_without_cuda_becomes_gloo(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    sdist.init_process_group("nccl", init_method="tcp://127.0.0.1:1", world_size=1, rank=0)
    try:
        assert dist.get_backend() == ("nccl" if torch.cuda.is_available() else "gloo")
    finally:
        dist.destroy_process_group()


def test_setup_layout_in_one_process(world_of_one):
    layout = sdist.setup_layout(pipeline_num_layers=4)
    assert (layout.data_parallel_size, layout.tensor_parallel_size, layout.pipeline_parallel_size) == (1, 1, 1)
    assert layout.tensor_parallel_rank == 0 and layout.data_parallel_rank == 0
    assert sdist.get_layout() is layout and sdist.current_layout() is layout
    mesh = sdist.layer_mesh(3)
    assert mesh.mesh_dim_names == ("dp", "tp") and mesh.mesh.tolist() == [[0]]
    assert sdist.get_hidden_sbp() == (torch.distributed.tensor.Shard(0), torch.distributed.tensor.Replicate())
    assert sdist.is_main_process()
    sdist.reset_layout()
    assert sdist.current_layout() is None


def test_libai_names_are_the_layouts():
    assert sdist.setup_dist_util is sdist.setup_layout
    assert sdist.get_dist_util is sdist.get_layout
    assert sdist.reset_dist_util is sdist.reset_layout
    assert sdist.get_layer_placement is sdist.layer_mesh


def test_all_reduce_flat_in_one_process_keeps_values_and_shapes():
    tensors = [torch.arange(6.0).view(2, 3), torch.ones(4, dtype=torch.float64), torch.arange(3.0)[::2]]
    before = [t.clone() for t in tensors]
    sdist.all_reduce_flat(tensors, average=True)
    for tensor, original in zip(tensors, before):
        assert tensor.dtype == original.dtype and torch.equal(tensor, original)
    with pytest.raises(TypeError, match="dense tensors"):
        sdist.all_reduce_flat([torch.ones(2).to_sparse()])
    with pytest.raises(ValueError, match="average=True needs"):
        sdist.all_reduce_flat([torch.ones(2)], op=sdist.ReduceOp.MAX, average=True)


def test_pipeline_of_one_stage_matches_the_whole_batch(world_of_one):
    sdist.setup_layout()
    torch.manual_seed(0)
    model, reference = torch.nn.Linear(4, 2), torch.nn.Linear(4, 2)
    reference.load_state_dict(model.state_dict())
    x, y = torch.randn(8, 4), torch.randn(8, 2)
    schedule = sdist.pipeline_schedule(model, n_microbatches=2, loss_fn=torch.nn.functional.mse_loss)
    losses = []
    schedule.step(x, target=y, losses=losses)
    torch.nn.functional.mse_loss(reference(x), y).backward()
    torch.testing.assert_close(model.weight.grad, reference.weight.grad)
    assert list(sdist.stage_layers()) == [0]
    with pytest.raises(ValueError, match="expected one of"):
        sdist.pipeline_schedule(model, n_microbatches=2, schedule="zigzag")


@pytest.mark.parametrize(
    "sizes, message",
    [
        (dict(data_parallel_size=2), r"2 \* 1 \* 1 = 2 does not equal the world size \(1\)"),
        (dict(tensor_parallel_size=2), r"world size \(1\) is not divisible by tensor_parallel_size"),
        (dict(pipeline_parallel_size=1, pipeline_num_layers=0), r"pipeline_num_layers \(0\) is smaller"),
        (dict(tensor_parallel_size=0), r"tensor_parallel_size must be at least 1, got 0"),
    ],
)
def test_bad_sizes_fail_before_any_collective(sizes, message):
    with pytest.raises(ValueError, match=message):
        sdist.setup_layout(**sizes)
    assert not dist.is_initialized()


@given(st.integers(1, 64).flatmap(lambda n: st.tuples(st.just(n), st.integers(1, n))))
def test_stage_layers_inverts_layer_stage(layers_and_stages):
    layers, stages = layers_and_stages
    layout = sdist.ParallelLayout(1, 1, stages, layers, "cpu", mesh=None, stage_meshes=[])
    held = [list(layout.stage_layers(stage)) for stage in range(stages)]
    assert sum(held, []) == list(range(layers))  # every layer once, in order
    assert max(map(len, held)) - min(map(len, held)) <= 1  # balanced
    assert all(layout.layer_stage(i) == stage for stage, ids in enumerate(held) for i in ids)


def test_layer_stage_split():
    layout = sdist.ParallelLayout(1, 1, 3, 8, "cpu", mesh=None, stage_meshes=[])
    assert [layout.layer_stage(i) for i in range(8)] == [0, 0, 1, 1, 1, 2, 2, 2]
    assert layout.layer_stage(-1) == 2
    with pytest.raises(IndexError, match="outside the pipeline's 8 layers"):
        layout.layer_stage(8)


# --- two gloo ranks: torch's own collectives, DDP, the meshes ---------------------------------

def check_collectives_are_torchs():
    x = torch.full((2,), float(dist.get_rank() + 1))
    sdist.all_reduce(x)
    assert x.tolist() == [3.0, 3.0]
    assert sdist.get_world_size() == 2
    group = sdist.new_group([0, 1])
    assert not isinstance(group, sdist.SingleProcessGroup)
    gathered = [torch.zeros(1) for _ in range(2)]
    sdist.all_gather(gathered, torch.tensor([float(dist.get_rank())]), group=group)
    assert [g.item() for g in gathered] == [0.0, 1.0]


def check_ddp_averages_gradients_like_one_process():
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    reference = torch.nn.Linear(4, 3)
    reference.load_state_dict(model.state_dict())
    x, y = torch.randn(8, 4), torch.randn(8, 3)
    wrapped = sdist.DistributedDataParallel(model, device_ids=[0], output_device=0)
    assert isinstance(wrapped, torch.nn.parallel.DistributedDataParallel)
    assert isinstance(wrapped, sdist.DistributedDataParallel)
    rank = dist.get_rank()
    torch.nn.functional.mse_loss(wrapped(x[rank * 4:(rank + 1) * 4]), y[rank * 4:(rank + 1) * 4]).backward()
    torch.nn.functional.mse_loss(reference(x), y).backward()
    torch.testing.assert_close(model.weight.grad, reference.weight.grad, rtol=1e-5, atol=1e-6)


def check_tensor_parallel_layout():
    from shim.nn import Linear1D

    layout = sdist.setup_layout(tensor_parallel_size=2)
    try:
        assert layout.data_parallel_size == 1
        assert layout.tensor_parallel_rank == dist.get_rank()
        assert sdist.layer_mesh(0).mesh.tolist() == [[0, 1]]
        with pytest.raises(TypeError, match=r"use shim.distributed.data_parallel\(model\)"):
            sdist.DistributedDataParallel(Linear1D(4, 4, parallel="col"))
    finally:
        sdist.reset_layout()


def check_pipeline_layout():
    layout = sdist.setup_layout(pipeline_parallel_size=2, pipeline_num_layers=4)
    try:
        assert layout.pipeline_stage == dist.get_rank()
        assert sdist.layer_mesh(1).mesh.tolist() == [[0]]
        assert sdist.layer_mesh(2).mesh.tolist() == [[1]]
    finally:
        sdist.reset_layout()


def check_bad_sizes_on_two_ranks():
    with pytest.raises(ValueError, match=r"1 \* 1 \* 3 = 3 does not equal the world size \(2\)"):
        sdist.setup_layout(data_parallel_size=1, pipeline_parallel_size=3, pipeline_num_layers=3)


def check_all_reduce_flat_equals_one_all_reduce_per_tensor():
    rank = dist.get_rank()
    torch.manual_seed(rank)
    tensors = [torch.randn(3, 4), torch.randn(5, dtype=torch.float64), torch.randn(2, 6).t(), torch.randn(7)]
    expected = [t.clone() for t in tensors]
    for tensor in expected:
        dist.all_reduce(tensor)  # torch's own, one collective per tensor
        tensor /= 2
    sdist.all_reduce_flat(tensors, average=True)
    for tensor, reference in zip(tensors, expected):
        assert tensor.dtype == reference.dtype
        torch.testing.assert_close(tensor, reference)


def check_rank_matches_world():
    assert sdist.get_world_size() == 2 and sdist.get_rank() in (0, 1)


def test_launch_from_a_process_that_has_a_process_group(world_of_one, launch):
    # forked workers would inherit this process group; the launch must not care
    launch({"rank": check_rank_matches_world}).assert_passed("rank")


CHECKS = {
    "collectives": check_collectives_are_torchs,
    "ddp": check_ddp_averages_gradients_like_one_process,
    "tensor_parallel_layout": check_tensor_parallel_layout,
    "pipeline_layout": check_pipeline_layout,
    "bad_sizes": check_bad_sizes_on_two_ranks,
    "all_reduce_flat": check_all_reduce_flat_equals_one_all_reduce_per_tensor,
}


@pytest.fixture(scope="module")
def two_ranks(launch):
    return launch(CHECKS)


@pytest.mark.parametrize("name", list(CHECKS))
def test_on_two_ranks(two_ranks, name):
    two_ranks.assert_passed(name)
