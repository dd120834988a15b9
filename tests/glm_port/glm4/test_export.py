"""glm-export on GLM-4 (issue 27): a glm-finetune LoRA adapter folded into a tiny GLM-4, written in THUDM's layout
(``config.json`` naming ``GLM4ForCausalLM``, GLM-4's tokenizer), in the serving dtype; from tensor-parallel shards
too; what GLM-4 has no layout for (``--quantize``) and the graphs it does not declare refused in one line."""

from __future__ import annotations

import json

import pytest
import torch

from glm_port.convert.export import main as export_main
from glm_port.finetune.run import main as finetune_main
from glm_port.models import FAMILIES, family_at

from tests.glm_port.glm4.common import IDS, logits

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory):
    """The tiny GLM-4 as a THUDM directory, and a LoRA adapter glm-finetune trained on it."""
    from glm_port.finetune.toy_task import write_toy_task
    from glm_port.models.glm4.tiny import build_tiny, write_directory

    root = tmp_path_factory.mktemp("glm4-export")
    (root / "tokenizer").mkdir()
    base = write_directory(*build_tiny(str(root / "tokenizer")), root / "base")
    finetune_main(["--model_name_or_path", base, "--do_train", "--train_file", str(write_toy_task(root / "data")[0]),
                   "--src_length", "12", "--tgt_length", "10", "--max_steps", "3", "--learning_rate", "5e-2",
                   "--lora", "--lora_target_modules", "query_key_value,dense_4h_to_h", "--output_dir",
                   str(root / "ft")])
    return root / "base", root / "ft" / "final"


def test_glm4_declares_export():
    assert "export" in FAMILIES["glm4"].supports


def test_glm_export_folds_a_glm4_adapter_into_thudms_layout(finetuned, tmp_path, capsys):
    import peft

    from glm_port.models.glm4.weights import load_pretrained, load_tokenizer

    base, adapter = finetuned
    export_main(["--model_name_or_path", str(base), "--lora_path", str(adapter), "--output_path", str(tmp_path / "out")])
    out = capsys.readouterr()
    assert "wrote" in out.out and "warning" not in out.err, out  # the base record matched
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == "chatglm" and config["architectures"] == ["GLM4ForCausalLM"]
    assert family_at(tmp_path / "out").name == "glm4"
    assert load_tokenizer(tmp_path / "out").encode("the cat 你好") == load_tokenizer(base).encode("the cat 你好")
    with torch.no_grad():
        adapted = peft.PeftModel.from_pretrained(load_pretrained(base), str(adapter)).eval()(input_ids=IDS).logits
    torch.testing.assert_close(logits(tmp_path / "out"), adapted, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(logits(base), adapted, atol=1e-4)  # the adapter was trained and matters


def test_glm_export_writes_a_glm4_in_the_serving_dtype_from_shards_too(finetuned, tmp_path, capsys):
    from safetensors.torch import load_file

    from glm_port.checkpoint_io import TRACKER, model_file_name
    from glm_port.models.chatglm2.weights import tensor_parallel_slice
    from glm_port.models.glm4.weights import load_pretrained, load_tokenizer

    base, _ = finetuned
    model = load_pretrained(base)
    shards = tmp_path / "shards"
    (shards / "3").mkdir(parents=True)
    for rank in range(2):
        module = {n: tensor_parallel_slice(n, t, model.config, rank, 2).clone() for n, t in model.state_dict().items()}
        torch.save({"module": module, "glm_config": model.config.to_dict()}, shards / "3" / model_file_name(rank))
    (shards / TRACKER).write_text("3")
    load_tokenizer(base).save_pretrained(shards)
    export_main(["--model_name_or_path", str(shards), "--dtype", "bf16", "--output_path", str(tmp_path / "out")])
    assert "in bfloat16" in capsys.readouterr().out
    assert json.loads((tmp_path / "out" / "config.json").read_text())["dtype"] == "bfloat16"
    weights = load_file(tmp_path / "out" / "model.safetensors")
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}
    for name, tensor in model.state_dict().items():
        assert torch.equal(weights[name], tensor.to(torch.bfloat16)), name


@pytest.mark.parametrize("flags, message", [
    (["--quantize", "int8"], "--quantize int8: glm-export writes quantized weights in THUDM's ChatGLM2 layout only"),
    (["--onnx"], "--onnx: the glm4 family does not support a decode-step graph"),
    (["--tokenizer_type", "glm"], "--tokenizer_type is for GLM vocabularies; the glm4 family reads its tokenizer.model"),
])
def test_what_glm_export_cannot_write_for_glm4_is_one_line_exit_2_nothing_written(finetuned, flags, message,
                                                                                   tmp_path, capsys):
    base, _ = finetuned
    with pytest.raises(SystemExit) as stop:
        export_main(["--model_name_or_path", str(base), "--output_path", str(tmp_path / "out"), *flags])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("glm-export: error: ") and message in err[0], err
    assert not (tmp_path / "out").exists()


def test_glm_export_quantize_on_glm4_is_refused_before_the_model_or_tokenizer_is_read(finetuned, tmp_path, capsys,
                                                                                    monkeypatch):
    """--quantize on a GLM-4 directory is one line before loading (it used to be said after the whole model had been
    read and the LoRA folded in): the family's loader, weight reader and tokenizer reader are never called."""
    from glm_port.models.glm4 import convert, weights

    def must_not_load(*args, **kwargs):
        raise AssertionError("glm-export loaded the model before refusing --quantize")

    for module, name in ((weights, "load_pretrained"), (weights, "open_weights"), (convert, "tokenizer_for")):
        monkeypatch.setattr(module, name, must_not_load)
    base, adapter = finetuned
    with pytest.raises(SystemExit) as stop:
        export_main(["--model_name_or_path", str(base), "--lora_path", str(adapter), "--output_path",
                     str(tmp_path / "out"), "--quantize", "int4"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--quantize int4: glm-export writes quantized weights in THUDM's ChatGLM2 layout only" \
        in err[0], err
    assert not (tmp_path / "out").exists()
