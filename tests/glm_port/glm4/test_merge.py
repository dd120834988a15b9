"""glm-merge on GLM-4 (issue 27): tensor-parallel shards as glm-finetune --tensor_parallel_degree writes them (the
GLM-4 config under 'glm_config', GLM-4's tokenizer beside them) are told from ChatGLM2's, load as they are, and merge
into one THUDM-layout GLM-4 directory; a transformers-layout GLM-4 merges into THUDM's layout; bad input is one line,
exit 2, nothing written. (glm-finetune's own TP 2 shards: tests/glm_port/glm4/test_finetune.py.)"""

from __future__ import annotations

import json

import pytest
import torch

from glm_port.checkpoint_io import TRACKER, model_file_name
from glm_port.convert.merge import main as merge_main
from glm_port.models import FAMILIES, family_at
from glm_port.models.chatglm2.weights import tensor_parallel_slice

from tests.glm_port.glm4.common import IDS, logits

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The tiny GLM-4, every weight random (std 0.3), and its tokenizer."""
    from glm_port.models.glm4.tiny import build_tiny

    model, tokenizer = build_tiny(str(tmp_path_factory.mktemp("glm4-tok")))
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0, 0.3)
    return model.eval(), tokenizer


def write_shards(model, tokenizer, directory, size, step=7):
    """``directory/<step>/mp_rank_XX_model_states.pt`` + the tracker + the tokenizer, as glm-finetune saves them."""
    (directory / str(step)).mkdir(parents=True)
    for rank in range(size):
        module = {name: tensor_parallel_slice(name, full, model.config, rank, size).clone()
                  for name, full in model.state_dict().items()}
        torch.save({"iteration": step, "module": module, "glm_config": model.config.to_dict()},
                   directory / str(step) / model_file_name(rank))
    (directory / TRACKER).write_text(str(step))
    tokenizer.save_pretrained(directory)
    return directory


def test_glm4_declares_merge():
    assert "merge" in FAMILIES["glm4"].supports


@pytest.mark.parametrize("size", [2, 4])  # 4 ranks on GLM-4's 2 key/value groups: each group held by 2
def test_glm4_shards_are_glm4s_load_as_they_are_and_merge_into_one_thudm_directory(tiny, size, tmp_path, capsys):
    model, tokenizer = tiny
    shards = write_shards(model, tokenizer, tmp_path / "shards", size)
    with torch.no_grad():
        expected = model(IDS).logits
    # the shards' config says model_type "chatglm" as ChatGLM2's does: GLM-4's tokenizer beside them tells them apart
    for path in (shards, shards / "7", shards / "7" / model_file_name(0)):
        assert family_at(path).name == "glm4", path
    torch.testing.assert_close(logits(shards), expected, rtol=0, atol=0)
    merge_main([str(shards), str(tmp_path / "merged")])
    out = capsys.readouterr().out
    assert f"({size} tensor-parallel shards)" in out and "GLM-4 tiktoken" in out, out
    merged = tmp_path / "merged"
    config = json.loads((merged / "config.json").read_text())
    assert config["model_type"] == "chatglm" and config["architectures"] == ["GLM4ForCausalLM"]
    assert config["rope_ratio"] == model.config.rope_ratio and config["eos_token_id"] == model.config.eos_token_id
    assert {"config.json", "model.safetensors", "tokenizer.model", "tokenizer_config.json"} <= {
        p.name for p in merged.iterdir()}
    assert family_at(merged).name == "glm4"
    torch.testing.assert_close(logits(merged), expected, rtol=0, atol=0)
    from glm_port.models.glm4.weights import load_tokenizer

    text = "the cat sat 你好"
    assert load_tokenizer(merged).encode(text) == tokenizer.encode(text)


def test_a_transformers_layout_glm4_merges_into_thudms_layout(tiny, tmp_path, capsys):
    from glm_port.models.glm4.tiny import write_directory

    model, tokenizer = tiny
    source = write_directory(model, tokenizer, tmp_path / "hf", "transformers")
    merge_main([source, str(tmp_path / "merged"), "--dtype", "bf16"])
    assert "in bfloat16" in capsys.readouterr().out
    config = json.loads((tmp_path / "merged" / "config.json").read_text())
    assert config["model_type"] == "chatglm" and config["dtype"] == "bfloat16"
    from safetensors.torch import load_file

    stored = load_file(tmp_path / "merged" / "model.safetensors")
    for name, tensor in model.state_dict().items():
        assert torch.equal(stored[name], tensor.to(torch.bfloat16)), name


@pytest.mark.parametrize("case, message", [
    ("no tokenizer", "no tokenizer.model beside"),
    ("not a rank file", "not a tiktoken rank file"),
    ("missing rank", "(a rank's file missing, or one from another model or degree?)"),
])
def test_bad_glm4_input_is_one_line_exit_2_and_nothing_written(tiny, case, message, tmp_path, capsys):
    model, tokenizer = tiny
    shards = write_shards(model, tokenizer, tmp_path / "shards", 2)
    argv = [str(shards), str(tmp_path / "out")]
    if case == "no tokenizer":
        for name in ("tokenizer.model", "tokenizer_config.json"):
            (shards / name).unlink()
    elif case == "not a rank file":
        (tmp_path / "vocab.txt").write_text("not a rank file\n")
        argv += ["--tokenizer-path", str(tmp_path / "vocab.txt")]
    else:
        (shards / "7" / model_file_name(1)).unlink()
    with pytest.raises(SystemExit) as stop:
        merge_main(argv)
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("glm-merge: error: ") and message in err[0], err
    assert not (tmp_path / "out").exists()
