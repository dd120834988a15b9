"""Parallel inference is invisible in the results: glm-generate at tensor parallel 2 (from a checkpoint saved at
model-parallel 1, and from one saved at 2), at pipeline parallel 2 and at data parallel 2 gives one process's
tokens (greedy and beam search); tensor- and pipeline-parallel logits agree with one process's within 1e-5
(fp32). Two gloo ranks, one launch; then four (tensor parallel 2 x pipeline parallel 2: each stage's layers split
over its two ranks), a second launch."""

import io
import json
import os
import tempfile
from pathlib import Path

import pytest
import torch

from glm_port.data.tokenization import tiny_wordpiece
from glm_port.generation import cli
from glm_port.models.glm import weights
from glm_port.models.glm.hf import GLMForConditionalGeneration, GLMPretrainedConfig
from glm_port.models.glm.tokenizer import GLMTokenizer

PROMPTS = ["the cat sat on the [MASK] .", "one [MASK] two [sMASK] three", "language models", "a [MASK] b"]
WORK = Path(tempfile.mkdtemp(prefix="glm-generate-parallel-"))
EXPECTED: dict = {}


def _write_checkpoints():
    vocab = tiny_wordpiece()
    torch.manual_seed(0)
    config = GLMPretrainedConfig(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=vocab.vocab_size,
                                 max_sequence_length=64, initializer_range=0.3)
    model = GLMForConditionalGeneration(config).eval()
    state = {k[len("glm."):]: v for k, v in model.state_dict().items()}
    weights.save_hf(state, WORK / "hf", config.to_dict())
    GLMTokenizer(vocab).save_pretrained(WORK / "hf")  # a Hugging Face directory carries its tokenizer
    mp = WORK / "mp2" / "1"
    mp.mkdir(parents=True)
    (WORK / "mp2" / "latest_checkpointed_iteration.txt").write_text("1")
    (WORK / "mp2" / "config.json").write_text(json.dumps(config.to_dict()))
    for rank in range(2):
        part = {k: weights.take_slice(k, v, 2, rank).clone() for k, v in state.items()}
        torch.save({"module": part}, mp / f"mp_rank_{rank:02d}_model_states.pt")
    three = GLMPretrainedConfig(num_layers=1, hidden_size=48, num_attention_heads=3, vocab_size=vocab.vocab_size,
                                max_sequence_length=64)
    weights.save_hf({k[len("glm."):]: v for k, v in GLMForConditionalGeneration(three).state_dict().items()},
                    WORK / "three_heads", three.to_dict())
    EXPECTED["json"] = generate(["--model", str(WORK / "hf")])
    ids = torch.randint(0, config.vocab_size, (2, 9), generator=torch.Generator().manual_seed(0))
    EXPECTED["ids"] = ids
    with torch.no_grad():
        EXPECTED["logits"] = model(ids, attention_mask=torch.tensor([5, 7])).logits


def generate(argv) -> list[dict]:
    args = cli.build_parser().parse_args([*argv, "--json", "--max-new-tokens", "6", *PROMPTS])
    out = io.StringIO()
    results = cli.run(args, out=out, err=io.StringIO())
    return results


def check_tensor_parallel_2_from_mp1():
    assert generate(["--model", str(WORK / "hf"), "--tensor-parallel-size", "2"]) == EXPECTED["json"]


def check_tensor_parallel_2_from_mp2():
    assert generate(["--model", str(WORK / "mp2"), "--tensor-parallel-size", "2"]) == EXPECTED["json"]


def check_tensor_parallel_2_beam_search():
    args = ["--num-beams", "3"]
    theirs = EXPECTED.get("beams")
    ours = generate(["--model", str(WORK / "hf"), "--tensor-parallel-size", "2", *args])
    assert ours == theirs


def check_data_parallel_2():
    assert generate(["--model", str(WORK / "hf")]) == EXPECTED["json"]


def check_pipeline_parallel_2():
    assert generate(["--model", str(WORK / "hf"), "--pipeline-parallel-size", "2"]) == EXPECTED["json"]


def check_pipeline_parallel_2_beam_search_from_mp2():
    ours = generate(["--model", str(WORK / "mp2"), "--pipeline-parallel-size", "2", "--num-beams", "3"])
    assert ours == EXPECTED["beams"]


def check_pipeline_parallel_logits():
    import shim.distributed as sdist
    from glm_port.distributed import PipelineStage
    from glm_port.generation.parallel import ModelParallel

    layout = sdist.setup_dist_util(pipeline_parallel_size=2)
    try:
        model = GLMForConditionalGeneration.from_pretrained(WORK / "hf", tensor_parallel=ModelParallel(
            1, 0, PipelineStage(layout)))
        held = [i for i, layer in enumerate(model.glm.transformer.layers)
                if not layer.mlp.dense_h_to_4h.weight.is_meta]
        assert held == [layout.pipeline_stage]  # two layers, one a stage; the other stage's never read
        with torch.no_grad():
            logits = model(EXPECTED["ids"], attention_mask=torch.tensor([5, 7])).logits
        torch.testing.assert_close(logits, EXPECTED["logits"], rtol=1e-5, atol=1e-5)
    finally:
        sdist.reset_dist_util()


def check_tensor_parallel_logits():
    import shim.distributed as sdist
    from glm_port.generation.parallel import ModelParallel

    layout = sdist.setup_dist_util(tensor_parallel_size=2)
    try:
        model = GLMForConditionalGeneration.from_pretrained(
            WORK / "hf", tensor_parallel=ModelParallel(2, layout.tensor_parallel_rank))
        assert hasattr(model.glm.transformer.layers[0].attention.query_key_value.weight, "device_mesh")
        with torch.no_grad():
            logits = model(EXPECTED["ids"], attention_mask=torch.tensor([5, 7])).logits
        torch.testing.assert_close(logits, EXPECTED["logits"], rtol=1e-5, atol=1e-5)
    finally:
        sdist.reset_dist_util()


def check_tensor_parallel_loads_in_the_dtype_asked():
    """dtype="bf16" at tensor parallel 2: every rank's slices are bf16 (not left in the file's fp32), and the
    logits are one bf16 process's within bf16's rounding."""
    import shim.distributed as sdist
    from glm_port.generation.parallel import ModelParallel

    layout = sdist.setup_dist_util(tensor_parallel_size=2)
    try:
        model = GLMForConditionalGeneration.from_pretrained(
            WORK / "hf", dtype="bf16", tensor_parallel=ModelParallel(2, layout.tensor_parallel_rank))
        dtypes = {name: p.to_local().dtype if hasattr(p, "device_mesh") else p.dtype
                  for name, p in model.named_parameters()}
        assert set(dtypes.values()) == {torch.bfloat16}, dtypes
        with torch.no_grad():
            logits = model(EXPECTED["ids"], attention_mask=torch.tensor([5, 7])).logits
        assert logits.dtype == torch.bfloat16
    finally:
        sdist.reset_dist_util()
    with torch.no_grad():  # one process in bf16: the same within bf16's rounding (sums split over two ranks)
        alone = GLMForConditionalGeneration.from_pretrained(WORK / "hf", dtype="bf16")(
            EXPECTED["ids"], attention_mask=torch.tensor([5, 7])).logits.float()
    assert (logits.float() - alone).abs().max() < 0.05 * alone.abs().max()


def check_heads_that_do_not_split_are_one_line_exit_2():
    import contextlib

    err = io.StringIO()
    with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exit_info:
        cli.main(["--model", str(WORK / "three_heads"), "--tensor-parallel-size", "2", "a [MASK]"])
    assert exit_info.value.code == 2
    line = err.getvalue().strip()
    assert line.startswith("glm-generate: error:") and "num_attention_heads" in line and "\n" not in line, line


CHECKS = {name: check for name, check in globals().items() if name.startswith("check_")}


# ---- four ranks: tensor parallel 2 x pipeline parallel 2 (LiBai's numbers: 1, 2, 2, all layers) ---------------
def check4_tensor_and_pipeline_parallel_greedy_from_mp2():
    # Upstream's mp_rank files at model-parallel 2: each rank reads its own file, its stage's weights only.
    ours = generate(["--model", str(WORK / "mp2"), "--tensor-parallel-size", "2", "--pipeline-parallel-size", "2"])
    assert ours == EXPECTED["json"]


def check4_tensor_and_pipeline_parallel_logits():
    import shim.distributed as sdist
    from glm_port.distributed import PipelineStage
    from glm_port.generation.parallel import ModelParallel

    layout = sdist.setup_dist_util(tensor_parallel_size=2, pipeline_parallel_size=2)
    try:
        model = GLMForConditionalGeneration.from_pretrained(WORK / "hf", tensor_parallel=ModelParallel(
            2, layout.tensor_parallel_rank, PipelineStage(layout)))
        stage, layers = layout.pipeline_stage, model.glm.transformer.layers
        mine = layers[stage].mlp.dense_h_to_4h.weight
        # This stage's layer: a DTensor on this stage's tensor-parallel ranks, holding half of the rows here.
        assert sorted(mine.device_mesh.mesh.tolist()) == sorted(layout.mesh.mesh[stage, 0].tolist())
        assert mine.to_local().shape[0] == 4 * 64 // 2 and not mine.to_local().is_meta
        # The other stage's layers: built on the meta device, on that stage's mesh: nothing held here.
        assert all(torch.distributed.tensor.DTensor.to_local(p).numel() == 0
                   for p in layers[1 - stage].attention.parameters())
        table = model.glm.word_embeddings.weight  # first stage: the input table; last: its tied-output copy
        assert sorted(table.device_mesh.mesh.tolist()) == sorted(layout.mesh.mesh[stage, 0].tolist())
        with torch.no_grad():
            logits = model(EXPECTED["ids"], attention_mask=torch.tensor([5, 7])).logits
        torch.testing.assert_close(logits, EXPECTED["logits"], rtol=1e-5, atol=1e-5)
    finally:
        sdist.reset_dist_util()


CHECKS4 = {name: check for name, check in globals().items() if name.startswith("check4_")}


@pytest.fixture(scope="module")
def references():
    _write_checkpoints()
    EXPECTED["beams"] = generate(["--model", str(WORK / "hf"), "--num-beams", "3"])
    os.environ.pop("WORLD_SIZE", None)


@pytest.fixture(scope="module")
def results(launch, references):
    return launch(CHECKS, world_size=2)


@pytest.fixture(scope="module")
def results4(launch, references):
    return launch(CHECKS4, world_size=4)


@pytest.mark.parametrize("name", list(CHECKS))
def test_parallel_generation_equals_one_process(results, name):
    results.assert_passed(name)


@pytest.mark.parametrize("name", list(CHECKS4))
def test_tensor_and_pipeline_parallel_equal_one_process(results4, name):
    results4.assert_passed(name)
