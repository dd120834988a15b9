"""GLM-4 under tensor parallel 2 (gloo, 2 processes): glm-generate's loader reads each rank's slices from a tiny
GLM-4 directory, THUDM's layout and transformers' ``glm`` layout alike, and greedy generation gives one
process's tokens (ChatGLM2's split rules: the 2 key/value groups one per rank)."""

import pytest
import torch

import shim.distributed as sdist


def _check_layout(layout):
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
    sdist.setup_dist_util(tensor_parallel_size=2)
    try:
        split, _ = generation.load(directory, dtype="fp32", device="cpu", tensor_parallel=ModelParallel(2, dist.get_rank()))
    finally:
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


def check_transformers_layout_loads_split():
    _check_layout("transformers")


CHECKS = {name: check for name, check in globals().items() if name.startswith("check_")}


@pytest.fixture(scope="module")
def two_ranks(launch):
    return launch(CHECKS)


@pytest.mark.parametrize("name", list(CHECKS))
def test_on_two_ranks(two_ranks, name):
    two_ranks.assert_passed(name)
