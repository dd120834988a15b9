"""shim.recompute (DeepSpeed's name: shim.checkpointing): activation recompute, RNG tracker replayed."""

import json

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import shim.checkpointing
import shim.recompute as ckpt


def test_checkpointing_is_deepspeeds_name_for_recompute():
    import shim.deepspeed

    assert shim.deepspeed.checkpointing is shim.checkpointing
    for name in shim.checkpointing.__all__:
        assert getattr(shim.checkpointing, name) is getattr(ckpt, name), name
    assert set(shim.checkpointing.__all__) == set(ckpt.__all__)


@pytest.fixture(autouse=True)
def fresh_tracker():
    ckpt.get_cuda_rng_tracker().reset()
    yield
    ckpt.get_cuda_rng_tracker().reset()


def _block(weight):
    def run(x):
        h = torch.nn.functional.dropout(x @ weight, p=0.5)  # default generator
        with ckpt.get_cuda_rng_tracker().fork():
            h = torch.nn.functional.dropout(h, p=0.5)  # tracker's tensor-parallel stream
        return torch.tanh(h)

    return run


def _grads(checkpointed: bool, policy=None):
    ckpt.model_parallel_cuda_manual_seed(1234)
    weight = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8, requires_grad=True)
    block = _block(weight)
    out = ckpt.checkpoint(block, x, policy=policy) if checkpointed else block(x)
    # draw from both streams between forward and backward: the recompute must not see it
    torch.rand(3)
    with ckpt.get_cuda_rng_tracker().fork():
        torch.rand(3)
    (out * torch.arange(8.0)).sum().backward()
    return out.detach(), weight.grad, x.grad


@pytest.mark.parametrize("policy", [None, ckpt.save_matmuls], ids=["full", "selective"])
def test_dropout_in_checkpoint_gives_identical_grads(policy):
    out, dw, dx = _grads(checkpointed=False)
    out_c, dw_c, dx_c = _grads(checkpointed=True, policy=policy)
    assert torch.equal(out, out_c)
    assert torch.equal(dw, dw_c) and torch.equal(dx, dx_c)


class _CountMatmuls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.matmuls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.matmuls += func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)
        return func(*args, **(kwargs or {}))


def _matmuls_in_backward(policy):
    w1, w2 = torch.randn(8, 16, requires_grad=True), torch.randn(16, 8, requires_grad=True)
    x = torch.randn(4, 8, requires_grad=True)
    out = ckpt.checkpoint(lambda x: torch.nn.functional.gelu(x @ w1) @ w2, x, policy=policy)
    with _CountMatmuls() as counter:
        out.sum().backward()
    return counter.matmuls


def test_selective_checkpoint_keeps_matmul_outputs():
    # Backward takes two matmuls per forward matmul (input and weight grads). Full checkpointing first
    # redoes the forward up to what backward needs, the GELU's input: one matmul. Selective keeps it.
    assert _matmuls_in_backward(policy=None) == 5
    assert _matmuls_in_backward(policy=ckpt.save_matmuls) == 4


def test_selective_checkpoint_recomputes_every_random_op():
    # A kept op does not run on recompute; if it drew random numbers (SDPA's kernels draw their dropout),
    # every recomputed dropout after it would draw a different mask from the forward pass's.
    policy = torch.utils.checkpoint.CheckpointPolicy
    random_ops = [torch.ops.aten._scaled_dot_product_efficient_attention.default,
                  torch.ops.aten._scaled_dot_product_flash_attention.default, torch.ops.aten.bernoulli_.float]
    assert all(ckpt.save_matmuls(None, op) == policy.PREFER_RECOMPUTE for op in random_ops)
    assert not any(torch.Tag.nondeterministic_seeded in op.tags for op in ckpt._KEPT_OPS)


def test_checkpoint_keeps_the_streams_moving_forward():
    ckpt.model_parallel_cuda_manual_seed(7)
    x = torch.randn(4, 8, requires_grad=True)
    first = ckpt.checkpoint(_block(torch.eye(8)), x)
    second = ckpt.checkpoint(_block(torch.eye(8)), x)
    assert not torch.equal(first, second)
    (first.sum() + second.sum()).backward()


def test_tracker_fork_leaves_default_generator_alone():
    ckpt.model_parallel_cuda_manual_seed(5)
    torch.manual_seed(0)
    expected = torch.rand(4)
    torch.manual_seed(0)
    with ckpt.get_cuda_rng_tracker().fork():
        tracked = torch.rand(4)
    assert torch.equal(torch.rand(4), expected)
    assert not torch.equal(tracked, expected)


def test_model_parallel_seed_streams_differ_from_default():
    ckpt.model_parallel_cuda_manual_seed(11)
    default = torch.rand(4)
    with ckpt.get_cuda_rng_tracker().fork():
        tracked = torch.rand(4)
    torch.manual_seed(11)
    assert torch.equal(default, torch.rand(4))
    torch.manual_seed(11 + 2718)
    assert torch.equal(tracked, torch.rand(4))


def test_tracker_errors_name_the_problem():
    tracker = ckpt.get_cuda_rng_tracker()
    tracker.add("a", 1)
    with pytest.raises(ValueError, match="seed 1 is already tracked"):
        tracker.add("b", 1)
    with pytest.raises(ValueError, match="'a' is already tracked"):
        tracker.add("a", 2)
    with pytest.raises(KeyError, match="'missing' is not tracked"):
        with tracker.fork("missing"):
            pass


class _FakeMpu:
    def get_model_parallel_rank(self):
        return 3


def test_configure_reads_deepspeed_config(tmp_path, monkeypatch):
    monkeypatch.setattr(ckpt, "_config", ckpt._Config())
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"activation_checkpointing": {"number_checkpoints": 4, "profile": True}}))
    assert not ckpt.is_configured()
    ckpt.configure(_FakeMpu(), deepspeed_config=str(config), num_checkpoints=6)
    assert ckpt.is_configured()
    assert ckpt._config.num_checkpoints == 6 and ckpt._config.profile
    ckpt.model_parallel_cuda_manual_seed(0)
    with ckpt.get_cuda_rng_tracker().fork():
        tracked = torch.rand(2)
    torch.manual_seed(2718 + 3)  # the mpu's rank picks the stream
    assert torch.equal(tracked, torch.rand(2))
    ckpt.reset()
    assert ckpt.is_configured()
    with pytest.warns(UserWarning, match="partition_activations has no effect"):
        ckpt.configure(None, partition_activations=True)


def test_checkpoint_passes_non_tensor_args_and_tuple_outputs():
    x = torch.randn(3, requires_grad=True)
    a, b = ckpt.checkpoint(lambda t, scale: (t * scale, t + 1), x, 2.0)
    (a.sum() + b.sum()).backward()
    assert torch.equal(x.grad, torch.full((3,), 3.0))
