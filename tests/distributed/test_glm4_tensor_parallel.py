"""GLM-4 under tensor parallel 2 (gloo, 2 processes): glm-generate's loader reads each rank's slices from a tiny
GLM-4 directory, THUDM's layout and transformers' ``glm`` layout alike, and greedy generation gives one
process's tokens (ChatGLM2's split rules: the 2 key/value groups one per rank)."""

import pytest
import torch

import shim.distributed as sdist


def _check_layout(layout, record=None):
    import shutil
    import tempfile

    import torch.distributed as dist

    from glm_port.generation.parallel import ModelParallel
    from glm_port.models.glm4 import generation
    from glm_port.models.glm4.tiny import build_tiny, write_directory

    whole, tok = build_tiny()
    with torch.no_grad():
        torch.manual_seed(0)
        for p in whole.parameters():
            p.normal_(0, 0.3)
    directory = tempfile.mkdtemp(prefix=f"glm4-tp-{layout}-{dist.get_rank()}-")
    write_directory(whole, tok, directory, layout)
    from glm_port.models.weights_io import Tensors

    getitem = Tensors.__getitem__
    if record is not None:  # the names read whole
        Tensors.__getitem__ = lambda self, name: record.append(name) or getitem(self, name)
    sdist.setup_dist_util(tensor_parallel_size=2)
    try:
        split, _ = generation.load(directory, dtype="fp32", device="cpu", tensor_parallel=ModelParallel(2, dist.get_rank()))
    finally:
        Tensors.__getitem__ = getitem
        sdist.reset_dist_util()
        shutil.rmtree(directory, ignore_errors=True)
    attn = split.transformer.encoder.layers[0].self_attention
    assert (attn.num_heads, attn.num_groups) == (2, 1)
    prompts = ["你好", "Mira is the fisher of the valley."]
    ours = generation.generate(split, tok, prompts, max_new_tokens=5, do_sample=False)
    reference = generation.generate(whole, tok, prompts, max_new_tokens=5, do_sample=False)
    assert [r["generated_ids"] for r in ours] == [r["generated_ids"] for r in reference]


def check_thudm_layout_loads_split():
    _check_layout("thudm")


def check_thudm_layout_reads_only_each_ranks_slices():
    """THUDM's layout stores the model's tensors: a rank reads a split weight as a slice of the file (the shared
    reader's ``Tensors.part``), never whole; only replicated tensors are read whole."""
    read = []
    _check_layout("thudm", read)
    split = ("query_key_value.weight", "self_attention.dense.weight", "dense_h_to_4h.weight", "dense_4h_to_h.weight")
    assert read and not [n for n in read if n.endswith(split)], read


def check_transformers_layout_loads_split():
    _check_layout("transformers")


CHECKS = {name: check for name, check in globals().items() if name.startswith("check_")}


@pytest.fixture(scope="module")
def two_ranks(launch):
    return launch(CHECKS)


@pytest.mark.parametrize("name", list(CHECKS))
def test_on_two_ranks(two_ranks, name):
    two_ranks.assert_passed(name)
