"""Sharded data parallel composed with tensor parallel (issue 30): four gloo ranks as tensor parallel 2 x
FSDP2 2 on one (dp, tp) mesh compute what one process computes. The tensor-parallel layers' weights are
DTensors on the tp dimension; ``fully_shard`` over the dp dimension makes them 2-D (dp, tp) DTensors.

fp32, no dropout; the one-process reference is built from the same seed before the layout is set up (the
tensor-parallel model initialises each weight whole, then splits it), and trains on the whole batch while
each data-parallel pair of ranks trains on its half. Clipping is set low enough to act.
"""

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from glm_port.distributed import ParallelEnv
from glm_port.models.glm import GLMConfig, GLMModel
from glm_port.training import OptimizerSettings, Precision, build_optimizer, train_step

CONFIG = GLMConfig(vocab_size=96, num_layers=2, hidden_size=32, num_attention_heads=2, max_sequence_length=24,
                   embedding_dropout_prob=0.0, attention_dropout_prob=0.0, output_dropout_prob=0.0)
STEPS, BATCH, LENGTH = 4, 4, 16
CLIP = 0.05
SAVE_DIR = "GLM_SHARDING_TP_TEST_DIR"


def _batch(step: int) -> dict:
    g = torch.Generator().manual_seed(100 + step)
    text = torch.randint(0, CONFIG.vocab_size, (BATCH, LENGTH), generator=g)
    sep = torch.randint(4, LENGTH - 4, (BATCH,), generator=g)
    position = torch.arange(LENGTH).expand(BATCH, LENGTH)
    block = (position - sep[:, None] + 1).clamp(min=0)
    loss_mask = (position >= sep[:, None]).long()
    return {"text": text, "position_id": torch.stack([position.minimum(sep[:, None]), block], 1),
            "attention_mask": sep, "target": torch.roll(text, -1, 1), "loss_mask": loss_mask}


def _half(batch: dict, rank: int) -> dict:
    per_rank = BATCH // 2
    return {k: v[rank * per_rank:(rank + 1) * per_rank] for k, v in batch.items()}


def _settings():
    return OptimizerSettings(lr=3e-3, weight_decay=0.01, warmup=0.0, decay_iters=STEPS)


def _train(stage: int):
    import shim.distributed as sdist

    torch.set_num_threads(1)
    sdist.reset_layout()  # a check before this one (same process) set one up
    torch.manual_seed(0)
    reference = GLMModel(CONFIG)  # no layout yet: a plain model
    env = ParallelEnv.from_environment(tensor_parallel_size=2, sharding_stage=stage)
    torch.manual_seed(0)
    model = env.shard(GLMModel(CONFIG))  # the same draws, each weight then split over tp, then sharded over dp
    optimizer, scheduler = build_optimizer(model, _settings())
    ref_optimizer, ref_scheduler = build_optimizer(reference, _settings())
    precision = Precision(torch.device("cpu"))
    one = ParallelEnv(torch.device("cpu"))
    norms, ref_norms = _record_norms(env), _record_norms(one)
    losses, ref_losses = [], []
    for step in range(STEPS):
        batch = _batch(step)
        losses.append(train_step(model, [_half(batch, env.dp_rank)], optimizer, scheduler, precision,
                                 clip_grad=CLIP, env=env))
        ref_losses.append(train_step(reference, [batch], ref_optimizer, ref_scheduler, precision, clip_grad=CLIP,
                                     env=one))
    for step, (a, b) in enumerate(zip(norms, ref_norms)):  # the clip's norm: every element counted once
        assert abs(a - b) <= 1e-5 * max(b, 1.0), f"step {step}: gradient norm {a} != one process's {b}"
    assert min(ref_norms) > CLIP  # the clip acted
    return env, model, optimizer, losses, reference, ref_losses


def _record_norms(env) -> list:
    norms, clip = [], env.clip_grad_norm

    def recorded(parameters, max_norm):
        norm = clip(parameters, max_norm)
        norms.append(float(norm))
        return norm

    env.clip_grad_norm = recorded
    return norms


def check_tp2_fsdp2_stage3_equals_one_process():
    from torch.distributed.tensor import DTensor

    env, model, _, losses, reference, ref_losses = _train(3)
    assert (env.tp_size, env.dp_size) == (2, 2)
    meshes = {p.device_mesh.mesh_dim_names for p in model.parameters() if isinstance(p, DTensor)}
    assert ("dp", "tp") in meshes  # tensor-parallel weights: 2-D (dp, tp) DTensors
    assert len(set(losses)) == len(losses)
    for step, (a, b) in enumerate(zip(losses, ref_losses)):
        assert abs(a - b) <= 1e-4, f"step {step}: tp x fsdp loss {a} != one-process loss {b}"


def check_whole_model_out_of_tp_shards():
    """The final save: each tensor-parallel rank's slices gathered over dp (``tensor_parallel_state_dict``),
    written as a tensor-parallel run writes them (``mp_rank_XX``); glm-merge's reader joins them into the
    one-process model's weights."""
    from glm_port.checkpoint_io import save_checkpoint
    from glm_port.convert.merge import merged_state
    from glm_port.models import FAMILIES
    from glm_port.models.glm import weights
    from glm_port.sharding import tensor_parallel_state_dict

    env, model, _, _, reference, _ = _train(2)
    state = tensor_parallel_state_dict(model)
    assert not any(hasattr(v, "device_mesh") for v in state.values())
    directory = Path(os.environ[SAVE_DIR]) / "final"
    save_checkpoint(directory, STEPS, state, config=CONFIG, save_rng=False, tp_rank=env.tp_rank,
                    writer=env.dp_rank == 0)
    dist.barrier()
    if dist.get_rank() == 0:
        merged = merged_state(FAMILIES["glm"].binding("hf"), weights.find_source(directory))
        ref = reference.state_dict()
        assert merged.keys() == ref.keys()
        for name, value in ref.items():
            torch.testing.assert_close(merged[name], value, rtol=1e-4, atol=1e-5, msg=name)


def check_sharded_checkpoint_resumes_at_the_same_layout():
    """A DCP checkpoint of the 2-D (dp, tp) shards loads back into a model built and sharded the same way."""
    from glm_port.checkpoint_io import load_checkpoint, save_sharded_checkpoint

    env, model, optimizer, *_ = _train(3)
    directory = Path(os.environ[SAVE_DIR]) / "ckpt"
    save_sharded_checkpoint(directory, STEPS, model, config=CONFIG, optimizer=optimizer)
    torch.manual_seed(1)  # other weights than the saved ones
    fresh = env.shard(GLMModel(CONFIG))
    fresh_optimizer, fresh_scheduler = build_optimizer(fresh, _settings())
    assert load_checkpoint(directory, fresh, optimizer=fresh_optimizer, scheduler=fresh_scheduler) == STEPS
    saved = model.state_dict()
    for name, value in fresh.state_dict().items():
        assert value.placements == saved[name].placements, name
        assert torch.equal(value.to_local(), saved[name].to_local()), name
    names = {p: n for n, p in fresh.named_parameters()}
    held = {n: optimizer.state[p] for n, p in model.named_parameters()}
    for param, state in fresh_optimizer.state.items():
        for key in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(state[key].to_local(), held[names[param]][key].to_local()), (names[param], key)


CHECKS = {name: fn for name, fn in globals().items() if name.startswith("check_")}


@pytest.fixture(scope="module")
def results(launch, tmp_path_factory):
    directory = tmp_path_factory.mktemp("sharding_tp")
    os.environ[SAVE_DIR] = str(directory)
    try:
        return launch(CHECKS, world_size=4), directory
    finally:
        del os.environ[SAVE_DIR]


@pytest.mark.parametrize("name", list(CHECKS))
def test_tp_sharded(results, name):
    results[0].assert_passed(name)


def test_tensor_parallel_dcp_checkpoint_is_not_read_whole_nor_loaded_at_another_size(results):
    """Its global tensors are in the tensor-parallel ranks' order (Megatron's strided QKV): glm-merge's reader
    and a load at tensor parallel 1 refuse it in one line instead of taking the weights misordered."""
    from glm_port.checkpoint_io import CheckpointError, find_checkpoint, load_checkpoint, read_sharded_weights

    checks, directory = results
    checks.assert_passed("check_sharded_checkpoint_resumes_at_the_same_layout")
    path = find_checkpoint(directory / "ckpt")
    with pytest.raises(CheckpointError, match="saved at tensor parallel 2 is not read whole"):
        read_sharded_weights(path.parent)
    with pytest.raises(CheckpointError, match="saved at tensor parallel 2 loads at the same tensor-parallel size"):
        load_checkpoint(directory / "ckpt", GLMModel(CONFIG))
