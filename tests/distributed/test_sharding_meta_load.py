"""glm-finetune --sharding loads a model without any rank but 0 holding it whole (issue 30).

Two gloo ranks run glm-finetune's ``setup`` (the family's loader, then FSDP2) on a ChatGLM2 directory saved here.
While it runs, every CPU tensor an operator creates is tracked until it dies (a ``TorchDispatchMode``, storages
held by weak references): the peak of the bytes alive at once is what the rank held. Rank 0 reads the checkpoint,
so it holds the whole model; rank 1 builds it on the meta device and receives its shards from rank 0, one tensor
in flight at a time, so it never holds more than its half, the largest tensor and a little more. The shards it
ends with are the checkpoint's weights, and its non-persistent buffers (rotary ``inv_freq``) rank 0's.
"""

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.multiprocessing.reductions import StorageWeakRef

DIRECTORY = "GLM_META_LOAD_TEST_DIR"  # set by the fixture before the launch (the forked ranks inherit it)
LAYERS = 8  # the layers outweigh the embedding and output layer, so a half is far from the whole


class LiveBytes(TorchDispatchMode):
    """The peak of the bytes of CPU tensor storages alive at once that operators created or that became a
    module's parameters or buffers (tensors read from a file are made outside the operators)."""

    def __init__(self):
        super().__init__()
        self.live, self.peak = {}, 0

    def _track(self, tensors) -> None:
        for tensor in tensors:
            if not isinstance(tensor, torch.Tensor):
                continue
            tensor = getattr(tensor, "_local_tensor", tensor)  # a DTensor: its shard
            if tensor.device.type != "cpu":
                continue
            storage = tensor.untyped_storage()
            self.live.setdefault(storage._cdata, (StorageWeakRef(storage), storage.nbytes()))
        self.live = {key: value for key, value in self.live.items() if not value[0].expired()}
        self.peak = max(self.peak, sum(nbytes for _, nbytes in self.live.values()))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self._track(tree_leaves(out))
        return out

    def __enter__(self):
        from torch.nn.modules import module

        hook = lambda _module, _name, tensor: self._track([tensor])  # noqa: E731
        self._hooks = [module.register_module_parameter_registration_hook(hook),
                       module.register_module_buffer_registration_hook(hook)]
        return super().__enter__()

    def __exit__(self, *exc):
        for handle in self._hooks:
            handle.remove()
        return super().__exit__(*exc)


def check_rank_other_than_0_never_holds_the_whole_model():
    import shim.distributed as sdist
    from glm_port.finetune.run import parse_args, setup
    from glm_port.sharding import full_state_dict, non_persistent_buffers

    directory = Path(os.environ[DIRECTORY])
    args = parse_args(["--model_name_or_path", str(directory / "base"), "--do_train", "--train_file",
                       str(directory / "train.json"), "--sharding", "stage3", "--output_dir", str(directory / "out")])
    tracker = LiveBytes()
    with tracker:
        session = setup(args)
    model = session.model
    try:
        from safetensors.torch import load_file

        whole = {k: v for f in sorted((directory / "base").glob("*.safetensors")) for k, v in load_file(f).items()}
        whole_bytes = sum(t.nbytes for t in whole.values())
        largest = max(t.nbytes for t in whole.values())
        peaks = [None, None]
        dist.all_gather_object(peaks, tracker.peak)
        assert peaks[0] >= whole_bytes, peaks  # rank 0 reads the whole checkpoint (and the tracker sees it)
        # rank 1: its half, one whole tensor received from rank 0, and little else (the tokenizer, the data)
        assert peaks[1] <= whole_bytes // 2 + largest + whole_bytes // 20, (peaks, whole_bytes, largest)
        state = full_state_dict(model)  # collective; whole on rank 0
        if dist.get_rank() == 0:
            assert state.keys() == whole.keys()
            for name, tensor in whole.items():
                torch.testing.assert_close(state[name], tensor, rtol=0, atol=0, msg=name)
        assert not non_persistent_buffers(model)  # ChatGLM2 computes its rotary table in the forward
    finally:
        sdist.reset_layout()


def check_hybrid_sharding_fills_every_replica_from_rank_0():
    """--sharding_degree 1 on 2 ranks (HSDP: 2 replicas of 1 shard, the 2-D mesh): rank 1's replica, built on the
    meta device, holds the checkpoint's weights."""
    import shim.distributed as sdist
    from glm_port.finetune.run import parse_args, setup

    directory = Path(os.environ[DIRECTORY])
    args = parse_args(["--model_name_or_path", str(directory / "base"), "--do_train", "--train_file",
                       str(directory / "train.json"), "--sharding", "stage2", "--sharding_degree", "1",
                       "--output_dir", str(directory / "out")])
    try:
        model = setup(args).model
        from safetensors.torch import load_file

        whole = {k: v for f in sorted((directory / "base").glob("*.safetensors")) for k, v in load_file(f).items()}
        local = {name: p.to_local() for name, p in model.named_parameters()}
        assert local.keys() == whole.keys()
        for name, tensor in whole.items():  # one shard: each replica holds the whole tensor
            torch.testing.assert_close(local[name], tensor, rtol=0, atol=0, msg=name)
    finally:
        sdist.reset_layout()


def check_a_load_failing_on_rank_0_stops_every_rank():
    """Rank 0 fails reading the weights, rank 1 (which reads none) stops with one line instead of waiting."""
    import shim.distributed as sdist
    from glm_port.finetune.run import FinetuneError, parse_args, setup
    from glm_port.models import WeightsError
    from glm_port.models.chatglm2 import weights

    directory = Path(os.environ[DIRECTORY])
    args = parse_args(["--model_name_or_path", str(directory / "base"), "--do_train", "--train_file",
                       str(directory / "train.json"), "--sharding", "stage3", "--output_dir", str(directory / "out")])
    read = weights.load_pretrained
    if dist.get_rank() == 0:
        def broken(*_, **__):
            raise WeightsError("unreadable")
        weights.load_pretrained = broken
    try:
        with pytest.raises(WeightsError if dist.get_rank() == 0 else FinetuneError) as raised:
            setup(args)
        if dist.get_rank() == 1:
            assert str(raised.value) == "the model did not load on another rank (its log says why)"
    finally:
        weights.load_pretrained = read
        sdist.reset_layout()


def _glm4_argv(directory: Path, output: str, *extra) -> list[str]:
    return ["--model_name_or_path", str(directory / "glm4"), "--do_train", "--train_file", str(directory / "train.json"),
            "--src_length", "12", "--tgt_length", "10", "--max_steps", "3", "--logging_steps", "1",
            "--learning_rate", "3e-3", "--do_eval", "false", "--output_dir", str(directory / output), *extra]


def check_glm4_sharded_finetune_from_a_directory():
    """GLM-4 (a saved directory) under --sharding stage3 on 2 ranks at batch 16 each: its log, for the test."""
    import contextlib
    import io

    import shim.distributed as sdist
    from glm_port.finetune.run import main

    directory = Path(os.environ[DIRECTORY])
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            main(_glm4_argv(directory, "glm4_fsdp", "--sharding", "stage3", "--per_device_train_batch_size", "16"))
    finally:
        sdist.reset_layout()
    if dist.get_rank() == 0:
        (directory / "glm4_fsdp.log").write_text(out.getvalue())


class _Rotary(torch.nn.Module):
    """A block list and a non-persistent buffer, as a rotary embedding's ``inv_freq`` is held elsewhere."""

    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(2))
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, 8, 2).float() / 8), persistent=False)


def check_non_persistent_buffers_come_from_rank0():
    import shim.distributed as sdist
    from glm_port.distributed import ParallelEnv
    from glm_port.sharding import non_persistent_buffers, shard_from_rank0

    env = ParallelEnv.from_environment(sharding_stage=3)
    try:
        for rank0_on_meta in (False, True):  # rank 0's loaded model sharded itself, or its weights (``whole``)
            whole = None
            if dist.get_rank() == 0:
                torch.manual_seed(0)
                whole = _Rotary()
                expected = [whole.inv_freq.clone(), *(p.detach().clone() for p in whole.parameters())]
            if dist.get_rank() == 0 and not rank0_on_meta:
                model, whole = whole, None
            else:
                with torch.device("meta"):
                    model = _Rotary()
            assert non_persistent_buffers(model) == ["inv_freq"]
            shard_from_rank0(model, env.sharding, whole=whole)
            held = [model.inv_freq, *(p.full_tensor() for p in model.parameters())]
            gathered = [None, None]
            dist.all_gather_object(gathered, held)
            if dist.get_rank() == 0:
                for rank in (0, 1):
                    for tensor, value in zip(gathered[rank], expected, strict=True):
                        torch.testing.assert_close(tensor, value, rtol=0, atol=0)
    finally:
        sdist.reset_layout()


CHECKS = {name: fn for name, fn in globals().items() if name.startswith("check_")}


@pytest.fixture(scope="module")
def results(launch, tmp_path_factory):
    from glm_port.finetune.toy_task import write_toy_task
    from glm_port.models.chatglm2.finetune import save
    from glm_port.models.chatglm2.tiny import build_tiny

    directory = tmp_path_factory.mktemp("meta_load")
    (directory / "tokenizer").mkdir()
    save(*build_tiny(str(directory / "tokenizer"), num_layers=LAYERS), directory / "base")
    from glm_port.models.glm4.finetune import save as save_glm4
    from glm_port.models.glm4.tiny import build_tiny as build_glm4

    save_glm4(*build_glm4(), directory / "glm4")
    train = write_toy_task(directory / "data")[0]
    (directory / "train.json").write_text(Path(train).read_text())
    os.environ[DIRECTORY] = str(directory)
    try:
        return launch(CHECKS), directory
    finally:
        del os.environ[DIRECTORY]


@pytest.mark.parametrize("name", list(CHECKS))
def test_meta_load(results, name):
    results[0].assert_passed(name)


def test_glm4_sharded_finetune_logs_the_losses_of_one_process(results, capsys):
    """Its ranks built on the meta device and filled from rank 0: one process's losses at batch 32 (1e-4)."""
    import re

    from glm_port.finetune.run import main

    checks, directory = results
    checks.assert_passed("check_glm4_sharded_finetune_from_a_directory")
    loss = re.compile(r"^ iteration +(\d+)/ +\d+ \| .* \| lm loss (\S+) \|$", re.MULTILINE)
    sharded = {int(m[1]): float(m[2]) for m in loss.finditer((directory / "glm4_fsdp.log").read_text())}
    main(_glm4_argv(directory, "glm4_one", "--per_device_train_batch_size", "32"))
    single = {int(m[1]): float(m[2]) for m in loss.finditer(capsys.readouterr().out)}
    assert sorted(sharded) == sorted(single) == [1, 2, 3]
    for step, value in single.items():
        assert sharded[step] == pytest.approx(value, rel=1e-4), step
