"""A small pre-LN transformer block under tensor parallel 2, data parallel 2 (DDP and FSDP2) and
pipeline parallel 2, and on four ranks under TP 2 x DP 2 (FSDP2) and TP 2 x PP 2, matches the same
block run whole in one process (fp32, 1e-5)."""

import copy
import contextlib

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

import shim.distributed as sdist
from shim.nn.tensor_parallel import Linear1D, heads_per_rank, strided_order

TOL = dict(rtol=1e-5, atol=1e-5)
HIDDEN, HEADS, BATCH, SEQ = 16, 4, 4, 6


class Block(nn.Module):
    """Pre-LN attention + tanh-GELU MLP; fused QKV split per third across tensor-parallel ranks."""

    def __init__(self, hidden=HIDDEN, heads=HEADS, layer_idx=0):
        super().__init__()
        self.local_heads = heads_per_rank(heads)
        self.head_dim = hidden // heads
        self.input_layernorm = nn.LayerNorm(hidden)
        self.query_key_value = Linear1D(hidden, 3 * hidden, parallel="col", stride=3, layer_idx=layer_idx)
        self.dense = Linear1D(hidden, hidden, parallel="row", layer_idx=layer_idx)
        self.post_attention_layernorm = nn.LayerNorm(hidden)
        self.dense_h_to_4h = Linear1D(hidden, 4 * hidden, parallel="col", layer_idx=layer_idx)
        self.dense_4h_to_h = Linear1D(4 * hidden, hidden, parallel="row", layer_idx=layer_idx)

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (
            t.view(b, s, self.local_heads, self.head_dim).transpose(1, 2)
            for t in self.query_key_value(self.input_layernorm(x)).chunk(3, dim=-1)
        )
        attention = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.dense(attention.transpose(1, 2).reshape(b, s, self.local_heads * self.head_dim))
        h = nn.functional.gelu(self.dense_h_to_4h(self.post_attention_layernorm(x)), approximate="tanh")
        return x + self.dense_4h_to_h(h)


@contextlib.contextmanager
def layout(**sizes):
    sdist.setup_layout(**sizes)
    try:
        yield
    finally:
        sdist.reset_layout()


def _seeded_block(layer_idx):
    torch.manual_seed(layer_idx)  # per layer, so a pipeline stage can build its layers alone
    return Block(layer_idx=layer_idx)


def _inputs():
    g = torch.Generator().manual_seed(1)
    return torch.randn(BATCH, SEQ, HIDDEN, generator=g), torch.randn(BATCH, SEQ, HIDDEN, generator=g)


def _reference(num_layers=1):
    """The whole model and its gradients for mse(model(x), y), built as one process would."""
    with layout(data_parallel_size=dist.get_world_size()):  # tensor-parallel size 1: plain layers
        model = nn.Sequential(*[_seeded_block(i) for i in range(num_layers)])
    x, y = _inputs()
    loss = nn.functional.mse_loss(model(x), y)
    loss.backward()
    return model, loss.detach()


def _whole_grad(name, param, tp_size):
    grad = param.grad.full_tensor() if isinstance(param.grad, DTensor) else param.grad
    if name.startswith("query_key_value") and tp_size > 1:
        grad = strided_order(grad, 0, tp_size, 3)  # back from rank-major [q0 k0 v0 | q1 k1 v1]
    return grad


def _assert_grads_match(model, reference, tp_size=1):
    reference_grads = dict(reference.named_parameters())
    for name, param in model.named_parameters():
        torch.testing.assert_close(
            _whole_grad(name, param, tp_size), reference_grads[name].grad, **TOL, msg=lambda m: f"{name}: {m}"
        )


def check_tensor_parallel_2():
    reference, reference_loss = _reference()
    with layout(tensor_parallel_size=2):
        block = _seeded_block(0)
        assert isinstance(block.query_key_value.weight, DTensor)
        x, y = _inputs()
        loss = nn.functional.mse_loss(block(x), y)
        torch.testing.assert_close(loss.detach(), reference_loss, **TOL)
        loss.backward()
        _assert_grads_match(block, reference[0], tp_size=2)


def check_data_parallel_2_ddp():
    reference, reference_loss = _reference()
    with layout(data_parallel_size=2):
        model = sdist.data_parallel(_seeded_block(0))
        assert isinstance(model, nn.parallel.DistributedDataParallel)
        x, y = (t.chunk(2)[dist.get_rank()] for t in _inputs())
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        dist.all_reduce(loss.detach_())
        torch.testing.assert_close(loss / 2, reference_loss, **TOL)
        _assert_grads_match(model.module, reference[0])


def check_data_parallel_2_fsdp():
    reference, _ = _reference()
    with layout(data_parallel_size=2):
        model = sdist.data_parallel(_seeded_block(0), shard=True)
        assert isinstance(model.dense.weight, DTensor)  # parameters sharded over dp
        x, y = (t.chunk(2)[dist.get_rank()] for t in _inputs())
        nn.functional.mse_loss(model(x), y).backward()
        _assert_grads_match(model, reference[0])


def _step_and_check_loss(schedule, stage: int, reference_loss):
    """One pipeline step of two stages: stage 0 feeds the inputs, stage 1 checks the mean loss."""
    x, y = _inputs()
    if stage == 0:
        schedule.step(x)
    else:
        losses = []
        schedule.step(target=y, losses=losses)
        torch.testing.assert_close(torch.stack(losses).mean(), reference_loss, **TOL)


def check_pipeline_parallel_2():
    reference, reference_loss = _reference(num_layers=2)
    with layout(pipeline_parallel_size=2, pipeline_num_layers=2):
        stage = dist.get_rank()
        assert list(sdist.stage_layers()) == [stage]
        assert sdist.layer_mesh(stage).mesh.tolist() == [[stage]]
        stage_module = nn.Sequential(*[copy.deepcopy(reference[i]) for i in sdist.stage_layers()])
        stage_module.zero_grad()
        schedule = sdist.pipeline_schedule(stage_module, n_microbatches=2, loss_fn=nn.functional.mse_loss)
        _step_and_check_loss(schedule, stage, reference_loss)
        _assert_grads_match(stage_module[0], reference[stage])


def check_bad_configuration_fails_before_collectives():
    with layout(tensor_parallel_size=2):
        with pytest.raises(ValueError, match=r"num_attention_heads \(3\) is not divisible by tensor_parallel_size \(2\)"):
            Block(hidden=12, heads=3)
    with pytest.raises(ValueError, match="does not equal the world size"):
        sdist.setup_layout(data_parallel_size=2, tensor_parallel_size=2)


def check4_tensor_parallel_2_with_fsdp_data_parallel_2():
    reference, _ = _reference()
    with layout(tensor_parallel_size=2, data_parallel_size=2):
        model = sdist.data_parallel(_seeded_block(0))  # DTensor weights: FSDP2 on the same root mesh
        x, y = (t.chunk(2)[sdist.current_layout().data_parallel_rank] for t in _inputs())
        nn.functional.mse_loss(model(x), y).backward()
        _assert_grads_match(model, reference[0], tp_size=2)


def check4_tensor_parallel_2_with_pipeline_parallel_2():
    reference, reference_loss = _reference(num_layers=2)
    with layout(tensor_parallel_size=2, pipeline_parallel_size=2, pipeline_num_layers=2):
        stage = sdist.current_layout().pipeline_stage
        stage_module = nn.Sequential(*[_seeded_block(i) for i in sdist.stage_layers()])
        schedule = sdist.pipeline_schedule(stage_module, n_microbatches=2, loss_fn=nn.functional.mse_loss)
        _step_and_check_loss(schedule, stage, reference_loss)
        _assert_grads_match(stage_module[0], reference[stage], tp_size=2)


def _checks(prefix):
    return {name[len(prefix):]: fn for name, fn in globals().items() if name.startswith(prefix)}


CHECKS, CHECKS4 = _checks("check_"), _checks("check4_")


@pytest.fixture(scope="module")
def two_ranks(launch):
    return launch(CHECKS)


@pytest.fixture(scope="module")
def four_ranks(launch):
    return launch(CHECKS4, world_size=4)


@pytest.mark.parametrize("name", list(CHECKS))
def test_on_two_ranks(two_ranks, name):
    two_ranks.assert_passed(name)


@pytest.mark.parametrize("name", list(CHECKS4))
def test_on_four_ranks(four_ranks, name):
    four_ranks.assert_passed(name)
