"""Sharded data parallel on FSDP2 (glm_port.sharding): two gloo ranks compute what one process computes,
each holding half of the parameters, gradients and optimizer state, and their DCP checkpoint loads in one
process.

fp32, no dropout (tests/distributed/sharding_common.py): each rank trains on its half of a global batch; the
one-process reference (run on every rank, from the same initial weights) trains on the whole batch. Gradient
clipping is set low enough to act, so the norm over DTensor shards is checked too.
"""

import copy
import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from glm_port.distributed import ParallelEnv
from glm_port.models.glm import GLMModel
from glm_port.training import Precision, build_optimizer, train_step
from tests.distributed.sharding_common import (CLIP, CONFIG, STEPS, assert_same_losses, assert_same_norms,
                                               glm_batch as _batch, half as _half, record_norms,
                                               settings as _settings)

SAVE_DIR = "GLM_SHARDING_TEST_DIR"  # set by the test before the launch (forked and clean launches inherit it)


def _micro(batch: dict, indices: list[int]) -> dict:
    return {k: v[indices] for k, v in batch.items()}


def _train(stage: int, degree: int | None = None, accumulation: int = 1):
    """Sharded run and one-process reference from the same weights: (sharded env, model, optimizer, its
    losses, reference model, reference losses)."""
    env = ParallelEnv.from_environment(sharding_stage=stage, sharding_degree=degree)
    torch.manual_seed(0)
    model = GLMModel(CONFIG)
    reference = copy.deepcopy(model)
    model = env.shard(model)
    optimizer, scheduler = build_optimizer(model, _settings())
    ref_optimizer, ref_scheduler = build_optimizer(reference, _settings())
    precision = Precision(torch.device("cpu"))
    one = ParallelEnv(torch.device("cpu"))
    norms, ref_norms = record_norms(env), record_norms(one)
    losses, ref_losses = [], []
    for step in range(STEPS):
        batch = _batch(step)
        if accumulation == 1:
            mine, whole = [_half(batch, env.dp_rank)], [batch]
        else:  # micro-batch k: sample k of each rank's half (rank r holds samples 2r, 2r + 1)
            mine = [_micro(batch, [2 * env.dp_rank + k]) for k in range(2)]
            whole = [_micro(batch, [k, 2 + k]) for k in range(2)]
        losses.append(train_step(model, mine, optimizer, scheduler, precision, clip_grad=CLIP, env=env))
        ref_losses.append(train_step(reference, whole, ref_optimizer, ref_scheduler, precision, clip_grad=CLIP,
                                     env=one))
    assert_same_norms(norms, ref_norms)  # the clip's norm over the shards: every element counted once
    return env, model, optimizer, losses, reference, ref_losses


def _assert_same_run(model, losses, reference, ref_losses):
    assert_same_losses(losses, ref_losses)
    ref = reference.state_dict()
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value.full_tensor(), ref[name], rtol=1e-4, atol=1e-5, msg=name)


def check_stage3_equals_one_process():
    from glm_port.sharding import is_sharded, transformer_layers

    env, model, optimizer, losses, reference, ref_losses = _train(3)
    assert optimizer.defaults["fused"]  # AdamW's fused kernel on the shards (one mesh), as on plain tensors
    assert is_sharded(model) and all(is_sharded(layer) for layer in transformer_layers(model))
    assert env.sharding.reshard_after_forward and not env.sharding.hybrid
    _assert_same_run(model, losses, reference, ref_losses)


def check_stage2_equals_one_process():
    env, model, _, losses, reference, ref_losses = _train(2)
    assert not env.sharding.reshard_after_forward
    _assert_same_run(model, losses, reference, ref_losses)


def check_gradient_accumulation_equals_one_process():
    # two micro-batches a step: FSDP2 reduce-scatters after the last one only (set_requires_gradient_sync)
    env, model, _, losses, reference, ref_losses = _train(2, accumulation=2)
    _assert_same_run(model, losses, reference, ref_losses)


def check_hybrid_degree_1_equals_one_process():
    # sharding_degree below the data-parallel size: a 2-D (replicate, shard) mesh (HSDP), here 2 x 1
    env, model, _, losses, reference, ref_losses = _train(3, degree=1)
    assert env.sharding.hybrid and env.sharding.mesh.mesh_dim_names == ("replicate", "shard")
    _assert_same_run(model, losses, reference, ref_losses)


def check_bf16_computes_in_bf16_on_fp32_masters():
    """--bf16: MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): the layers see bf16 weights, the
    shards, their gradients and AdamW's states stay fp32; the losses track fp32's (2%)."""
    from glm_port.sharding import transformer_layers

    env = ParallelEnv.from_environment(sharding_stage=3)
    torch.manual_seed(0)
    model = env.shard(GLMModel(CONFIG), torch.bfloat16)
    seen = set()
    transformer_layers(model)[0].register_forward_pre_hook(lambda m, _: seen.add(m.attention.dense.weight.dtype))
    optimizer, scheduler = build_optimizer(model, _settings())
    precision = Precision(torch.device("cpu"), torch.bfloat16)
    losses = [train_step(model, [_half(_batch(step), env.dp_rank)], optimizer, scheduler, precision, clip_grad=CLIP,
                         env=env) for step in range(STEPS)]
    assert seen == {torch.bfloat16}
    for p in model.parameters():
        assert p.dtype == p.grad.dtype == optimizer.state[p]["exp_avg"].dtype == torch.float32
    _, _, _, fp32_losses, _, _ = _train(3)
    assert losses == pytest.approx(fp32_losses, rel=0.02)


def check_each_rank_holds_half():
    from glm_port.sharding import local_numel

    env, model, optimizer, *_ = _train(3)
    params = list(model.parameters())
    whole = sum(p.numel() for p in params)  # a DTensor's numel is the whole tensor's
    held = {
        "parameters": local_numel(params),
        "gradients": local_numel([p.grad for p in params]),
        "exp_avg": local_numel([optimizer.state[p]["exp_avg"] for p in params]),
        "exp_avg_sq": local_numel([optimizer.state[p]["exp_avg_sq"] for p in params]),
    }
    for what, count in held.items():
        # dim-0 shards: a tensor of odd rows leaves one rank a row more (at most one row per tensor)
        assert abs(count - whole / 2) <= sum(p.numel() / p.shape[0] for p in params), (what, count, whole)
    totals = torch.tensor([held["parameters"]])
    dist.all_reduce(totals)
    assert totals.item() == whole  # the shards add up to the model, nothing held twice


def check_whole_model_out_of_shards():
    from glm_port.sharding import full_state_dict, unsharded_twin

    _, model, _, _, reference, _ = _train(2)
    state = full_state_dict(model)
    if dist.get_rank() == 0:
        twin = unsharded_twin(model, state)
        assert type(twin) is GLMModel
        for name, value in reference.state_dict().items():
            torch.testing.assert_close(twin.state_dict()[name], value, rtol=1e-4, atol=1e-5, msg=name)
    else:
        assert state == {}


def check_save_sharded_checkpoint():
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    from glm_port.checkpoint_io import save_sharded_checkpoint
    from glm_port.sharding import full_state_dict

    env, model, optimizer, *_ = _train(3)
    directory = Path(os.environ[SAVE_DIR])
    save_sharded_checkpoint(directory / "ckpt", STEPS, model, config=CONFIG, optimizer=optimizer)
    weights = full_state_dict(model)
    states = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True,
                                                                                 cpu_offload=True))
    if dist.get_rank() == 0:  # what the world-of-one test compares against
        torch.save({"model": weights, "optimizer": states["state"]}, directory / "whole.pt")


CHECKS = {name: fn for name, fn in globals().items() if name.startswith("check_")}


@pytest.fixture(scope="module")
def results(launch, tmp_path_factory):
    directory = tmp_path_factory.mktemp("sharding")
    os.environ[SAVE_DIR] = str(directory)
    try:
        return launch(CHECKS), directory
    finally:
        del os.environ[SAVE_DIR]


@pytest.mark.parametrize("name", [n for n in CHECKS if n != "check_save_sharded_checkpoint"])
def test_sharded(results, name):
    results[0].assert_passed(name)


def test_checkpoint_saved_at_world_size_2_loads_in_one_process(results):
    from glm_port.checkpoint_io import find_checkpoint, load_checkpoint

    checks, directory = results
    checks.assert_passed("check_save_sharded_checkpoint")
    whole = torch.load(directory / "whole.pt", weights_only=True)
    assert not dist.is_initialized()
    torch.manual_seed(1)  # other weights than the saved ones
    model = GLMModel(CONFIG)
    optimizer, scheduler = build_optimizer(model, _settings())
    path = find_checkpoint(directory / "ckpt")
    assert path.parent.name == str(STEPS) and {".metadata", "__0_0.distcp", "__1_0.distcp"} <= {
        p.name for p in path.parent.iterdir()}
    assert load_checkpoint(directory / "ckpt", model, optimizer=optimizer, scheduler=scheduler) == STEPS
    for name, value in model.state_dict().items():
        assert torch.equal(value, whole["model"][name]), name
    # glm-merge's reader takes the whole weights and the architecture out of it too
    from glm_port.convert.merge import merged_state
    from glm_port.models import FAMILIES
    from glm_port.models.glm import weights

    source = weights.find_source(directory / "ckpt")
    assert weights.source_config(source).hidden_size == CONFIG.hidden_size
    merged = merged_state(FAMILIES["glm"].binding("hf"), source)
    assert merged.keys() == whole["model"].keys()
    for name, value in merged.items():
        assert torch.equal(value, whole["model"][name]), name
    names = {p: n for n, p in model.named_parameters()}
    for param, state in optimizer.state.items():
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(state[key], whole["optimizer"][names[param]][key]), (names[param], key)
