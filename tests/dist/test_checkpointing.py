"""shim.checkpointing: DeepSpeed's activation-checkpointing API, RNG tracker replayed on recompute."""

import json

import pytest
import torch

import shim.checkpointing as ckpt


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


def _grads(checkpointed: bool):
    ckpt.model_parallel_cuda_manual_seed(1234)
    weight = torch.randn(8, 8, requires_grad=True)
    x = torch.randn(4, 8, requires_grad=True)
    block = _block(weight)
    out = ckpt.checkpoint(block, x) if checkpointed else block(x)
    # draw from both streams between forward and backward: the recompute must not see it
    torch.rand(3)
    with ckpt.get_cuda_rng_tracker().fork():
        torch.rand(3)
    (out * torch.arange(8.0)).sum().backward()
    return out.detach(), weight.grad, x.grad


def test_dropout_in_checkpoint_gives_identical_grads():
    out, dw, dx = _grads(checkpointed=False)
    out_c, dw_c, dx_c = _grads(checkpointed=True)
    assert torch.equal(out, out_c)
    assert torch.equal(dw, dw_c) and torch.equal(dx, dx_c)


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
