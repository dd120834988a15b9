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
from glm_port.models.glm import GLMModel
from glm_port.training import Precision, build_optimizer, positions_logits, train_step
from tests.distributed.sharding_common import (BATCH, CLIP, CONFIG, LENGTH, STEPS, assert_same_losses,
                                               assert_same_norms, glm_batch, half, record_norms, settings)

SAVE_DIR = "GLM_SHARDING_TP_TEST_DIR"
# ChatGLM2 with ONE key/value group: at tensor parallel 2 both ranks hold it (its rows replicated, marked as
# duplicates on one of them), so the clip's norm must count those rows once over the 2-D (dp, tp) shards.
CHATGLM2 = dict(num_layers=2, hidden_size=64, ffn_hidden_size=96, kv_channels=16, num_attention_heads=4,
                multi_query_group_num=1, padded_vocab_size=128, seq_length=64)


def _glm(initial=None):
    """The one-process GLM (before any layout: a plain model), or the same weights built under the
    tensor-parallel layout set up since: the same draws, each weight then split over tp."""
    torch.manual_seed(0)
    return GLMModel(CONFIG)


def _chatglm2(initial=None):
    """The one-process ChatGLM2 (``initial`` None), or the weights ``initial`` (a state dict) in the model built
    under the tensor-parallel layout set up since."""
    from glm_port.models.chatglm2 import ChatGLM2Config, ChatGLM2ForCausalLM
    from glm_port.models.chatglm2.weights import load_tensor_parallel

    torch.manual_seed(0)
    model = ChatGLM2ForCausalLM(ChatGLM2Config(**CHATGLM2))
    if initial is not None:
        load_tensor_parallel(model, initial)
        # as the family's loader ends (load_state_dict with assign=True): new parameters, not marked duplicate
        model.load_state_dict(dict(model.state_dict()), assign=True)
    return model


def _chatglm2_batch(step: int) -> dict:
    """Right-padded causal batch as ChatGLM2's collate builds it: loss on the answer (after ``sep``)."""
    g = torch.Generator().manual_seed(200 + step)
    text = torch.randint(3, CHATGLM2["padded_vocab_size"], (BATCH, LENGTH), generator=g)
    sep = torch.randint(3, LENGTH - 6, (BATCH,), generator=g)
    length = torch.randint(LENGTH - 3, LENGTH + 1, (BATCH,), generator=g)
    position = torch.arange(LENGTH).expand(BATCH, LENGTH)
    real = position < length[:, None]
    return {"text": text * real, "attention_mask": real.long(), "target": torch.roll(text, -1, 1),
            "loss_mask": (real & (position >= sep[:, None]) & (position < length[:, None] - 1)).long()}


def _train(stage: int, family: str = "glm", dtype=None):
    """Tensor parallel 2 x FSDP2 ``stage`` and the one-process reference from the same weights, ``STEPS`` steps
    each; the clip's norm is one process's each step. ``dtype`` bf16: the sharded run computes in bf16 on fp32
    shards (the reference in fp32)."""
    import shim.distributed as sdist

    torch.set_num_threads(1)
    sdist.reset_layout()  # a check before this one (same process) set one up
    if family == "glm":
        build, batch_fn, logits_fn = _glm, glm_batch, positions_logits
    else:
        from glm_port.models.chatglm2.finetune import logits as logits_fn

        build, batch_fn = _chatglm2, _chatglm2_batch
    # The reference first, whole, before any layout (a family's logits read the tensor-parallel size set up)
    reference = build()
    initial = {k: v.clone() for k, v in reference.state_dict().items()}
    ref_optimizer, ref_scheduler = build_optimizer(reference, settings())
    one = ParallelEnv(torch.device("cpu"))
    ref_norms, ref_losses = record_norms(one), []
    for step in range(STEPS):
        ref_losses.append(train_step(reference, [batch_fn(step)], ref_optimizer, ref_scheduler,
                                     Precision(torch.device("cpu")), clip_grad=CLIP, env=one, logits_fn=logits_fn))
    env = ParallelEnv.from_environment(tensor_parallel_size=2, sharding_stage=stage)
    model = env.shard(build(initial), dtype)  # then sharded over dp: the split weights become 2-D (dp, tp) DTensors
    optimizer, scheduler = build_optimizer(model, settings())
    precision = Precision(torch.device("cpu"), dtype or torch.float32)
    norms, losses = record_norms(env), []
    for step in range(STEPS):
        losses.append(train_step(model, [half(batch_fn(step), env.dp_rank)], optimizer, scheduler, precision,
                                 clip_grad=CLIP, env=env, logits_fn=logits_fn))
    if dtype is None:
        assert_same_norms(norms, ref_norms)  # the clip's norm: every element counted once
    return env, model, optimizer, (losses, norms), reference, (ref_losses, ref_norms)


def check_tp2_fsdp2_stage3_equals_one_process():
    from torch.distributed.tensor import DTensor

    env, model, _, losses, reference, ref_losses = _train(3)
    assert (env.tp_size, env.dp_size) == (2, 2)
    meshes = {p.device_mesh.mesh_dim_names for p in model.parameters() if isinstance(p, DTensor)}
    assert ("dp", "tp") in meshes  # tensor-parallel weights: 2-D (dp, tp) DTensors
    assert_same_losses(losses[0], ref_losses[0])


def check_chatglm2_tp2_fsdp2_replicated_key_value_rows_count_once():
    """ChatGLM2's one key/value group is held by both tensor-parallel ranks: under FSDP2 the rows marked
    duplicate on one of them stay out of the clip's norm (one process's, 1e-5, each step), and the losses are
    one process's, at stage 2 and stage 3."""
    for stage in (2, 3):
        env, model, _, (losses, _), _, (ref_losses, _) = _train(stage, "chatglm2")
        attention = model.transformer.encoder.layers[0].self_attention
        assert attention.num_groups == 1 and attention.group_replicas == 2
        assert_same_losses(losses, ref_losses)


def check_tp2_fsdp2_bf16_computes_in_bf16_on_fp32_shards():
    """--bf16 under TP x FSDP2: MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) on the 2-D shards; the
    tensor-parallel layers see bf16 weights, the shards, their gradients and AdamW's states stay fp32, and the
    losses track one fp32 process's (2%)."""
    from torch.distributed.tensor import DTensor

    from glm_port.sharding import transformer_layers

    seen = set()
    real_shard = ParallelEnv.shard

    def shard_and_watch(env, model, dtype=None):
        model = real_shard(env, model, dtype)
        dense = transformer_layers(model)[0].attention.dense
        dense.register_forward_pre_hook(lambda m, _: seen.add((type(m.weight), m.weight.dtype)))
        return model

    ParallelEnv.shard = shard_and_watch
    try:
        _, model, optimizer, (losses, _), _, (ref_losses, _) = _train(3, dtype=torch.bfloat16)
    finally:
        ParallelEnv.shard = real_shard
    assert seen == {(DTensor, torch.bfloat16)}  # the gathered tensor-parallel weight, in bf16
    for p in model.parameters():
        assert p.dtype == p.grad.dtype == optimizer.state[p]["exp_avg"].dtype == torch.float32
    assert any(p.device_mesh.ndim == 2 for p in model.parameters())
    assert losses == pytest.approx(ref_losses, rel=0.02) and losses != pytest.approx(ref_losses, rel=1e-6)


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
    fresh_optimizer, fresh_scheduler = build_optimizer(fresh, settings())
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
