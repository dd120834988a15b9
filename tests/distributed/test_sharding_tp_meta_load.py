"""glm-finetune --tensor_parallel_degree 2 --sharding loads a model without any rank but the data-parallel rank 0
of each tensor-parallel group holding its tensor-parallel slices whole.

Four gloo ranks (tensor parallel 2 x FSDP2 2 on the (dp, tp) mesh) run glm-finetune's ``setup`` on a ChatGLM2
directory saved here with ONE key/value group (both tensor-parallel ranks hold its rows, one marks them
duplicate). Every CPU tensor an operator creates is tracked while it runs (``LiveBytes``, the storages alive at
once): a data-parallel rank 1 builds its tensor-parallel model on the meta device and receives its shards from its
group's data-parallel rank 0, one slice of one tensor in flight, so it never holds more than half its slices, the
largest slice of a tensor and a little more. Each rank's shards and duplicate-row marks are those of its slices
read and sharded as before (``load_split`` then ``shard_model``).
"""

import os
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.distributed.test_sharding_meta_load import LiveBytes

DIRECTORY = "GLM_TP_META_LOAD_TEST_DIR"  # set by the fixture before the launch (the forked ranks inherit it)
LAYERS = 12  # the layers outweigh the embedding and output layer, so a half is far from the whole


def check_a_data_parallel_rank_1_never_holds_its_tensor_parallel_slices_whole():
    import shim.distributed as sdist
    from glm_port.finetune.run import parse_args, setup
    from glm_port.models.chatglm2.generation import load_split
    from glm_port.models.chatglm2.weights import check_directory
    from glm_port.sharding import shard_model

    torch.set_num_threads(1)
    directory = Path(os.environ[DIRECTORY])
    args = parse_args(["--model_name_or_path", str(directory / "base"), "--do_train", "--train_file",
                       str(directory / "train.json"), "--sharding", "stage3", "--tensor_parallel_degree", "2",
                       "--output_dir", str(directory / "out")])
    tracker = LiveBytes()
    with tracker:
        session = setup(args)
    model, env = session.model, session.env
    try:
        assert (env.tp_size, env.dp_size) == (2, 2)
        # as before: this rank's slices read whole, then sharded over dp (the reference)
        reference = load_split(directory / "base", check_directory(directory / "base"), device="cpu")
        slices = {name: (t.to_local() if hasattr(t, "to_local") else t) for name, t in reference.state_dict().items()}
        slice_bytes = sum(t.nbytes for t in slices.values())
        largest = max(t.nbytes for t in slices.values())
        whole_bytes = sum(p.stat().st_size for p in (directory / "base").glob("*.safetensors"))
        shard_model(reference, env.sharding)
        held = [None] * 4
        dist.all_gather_object(held, (env.dp_rank, tracker.peak, slice_bytes, largest))
        for dp_rank, peak, size, big in held:
            if dp_rank == 0:  # reads its slices (and the tracker sees them)
                assert peak >= size, held
            else:  # half its slices, one slice of one tensor in flight, and little else (tokenizer, data)
                assert peak <= size // 2 + big + whole_bytes // 20, held
        ours, theirs = dict(model.named_parameters()), dict(reference.named_parameters())
        assert ours.keys() == theirs.keys()
        marked = 0
        for name, param in theirs.items():
            torch.testing.assert_close(ours[name].to_local(), param.to_local(), rtol=0, atol=0, msg=name)
            assert ours[name].placements == param.placements and ours[name].shape == param.shape, name
            rows = getattr(param, "sharded_duplicate_rows", None)
            assert getattr(ours[name], "sharded_duplicate_rows", None) == rows, name
            marked += bool(rows)
        marks = [None] * 4
        dist.all_gather_object(marks, marked)
        assert any(marks), marks  # the replicated key/value rows are marked somewhere (the clip's norm)
    finally:
        sdist.reset_layout()


CHECKS = {name: fn for name, fn in globals().items() if name.startswith("check_")}


@pytest.fixture(scope="module")
def results(launch, tmp_path_factory):
    from glm_port.finetune.toy_task import write_toy_task
    from glm_port.models.chatglm2.finetune import save
    from glm_port.models.chatglm2.tiny import build_tiny

    directory = tmp_path_factory.mktemp("tp_meta_load")
    (directory / "tokenizer").mkdir()
    save(*build_tiny(str(directory / "tokenizer"), num_layers=LAYERS, multi_query_group_num=1), directory / "base")
    train = write_toy_task(directory / "data")[0]
    (directory / "train.json").write_text(Path(train).read_text())
    os.environ[DIRECTORY] = str(directory)
    try:
        return launch(CHECKS, world_size=4)
    finally:
        del os.environ[DIRECTORY]


@pytest.mark.parametrize("name", list(CHECKS))
def test_tp_meta_load(results, name):
    results.assert_passed(name)
