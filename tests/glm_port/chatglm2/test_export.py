"""glm-export on ChatGLM2: a glm-finetune LoRA adapter folded into the tiny ChatGLM2, written in THUDM's layout
(it used to stop at "unexpected weight transformer.embedding..."); the graphs it declares no support for refused."""

import json

import pytest
import torch

from glm_port.convert.export import main as export_main
from glm_port.finetune.run import main as finetune_main

IDS = torch.tensor([[5, 17, 42, 99, 7, 300, 11, 64], [790, 792, 8, 9, 10, 11, 12, 13]])


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory):
    """The tiny ChatGLM2 saved as a THUDM directory, and a LoRA adapter glm-finetune trained on it."""
    from glm_port.finetune.toy_task import write_toy_task
    from glm_port.models.chatglm2.finetune import save
    from glm_port.models.chatglm2.tiny import build_tiny

    root = tmp_path_factory.mktemp("chatglm2-export")
    (root / "tokenizer").mkdir()
    save(*build_tiny(str(root / "tokenizer")), root / "base")
    finetune_main(["--model_name_or_path", str(root / "base"), "--do_train", "--train_file",
                   str(write_toy_task(root / "data")[0]), "--src_length", "12", "--tgt_length", "10",
                   "--max_steps", "3", "--learning_rate", "1e-2", "--lora", "--lora_target_modules",
                   "query_key_value,dense_4h_to_h", "--output_dir", str(root / "ft")])
    return root / "base", root / "ft" / "final"


def test_glm_export_folds_a_chatglm2_adapter_into_thudms_layout(finetuned, tmp_path, capsys):
    import peft

    from glm_port.models.chatglm2.weights import load_pretrained, load_tokenizer

    base, adapter = finetuned
    export_main(["--model_name_or_path", str(base), "--lora_path", str(adapter), "--output_path", str(tmp_path / "out")])
    out = capsys.readouterr()
    assert "wrote" in out.out and "warning" not in out.err, out  # the base record matched
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["model_type"] == "chatglm" and config["architectures"] == ["ChatGLM2ForCausalLM"]
    assert load_tokenizer(tmp_path / "out").vocab_file and (tmp_path / "out" / "tokenizer.model").is_file()
    with torch.no_grad():
        exported = load_pretrained(tmp_path / "out")(IDS).logits
        adapted = peft.PeftModel.from_pretrained(load_pretrained(base), str(adapter)).eval()(input_ids=IDS).logits
        plain = load_pretrained(base)(IDS).logits
    torch.testing.assert_close(exported, adapted, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(plain, adapted, atol=1e-4)  # the adapter was trained and matters


def test_glm_export_writes_a_chatglm2_in_the_serving_dtype(finetuned, tmp_path, capsys):
    from safetensors.torch import load_file

    base, _ = finetuned
    export_main(["--model_name_or_path", str(base), "--dtype", "bf16", "--output_path", str(tmp_path / "out")])
    assert "in bfloat16" in capsys.readouterr().out
    assert json.loads((tmp_path / "out" / "config.json").read_text())["dtype"] == "bfloat16"
    weights = load_file(tmp_path / "out" / "model.safetensors")
    assert {t.dtype for t in weights.values()} == {torch.bfloat16}


@pytest.mark.parametrize("flag", ["--onnx", "--torch_export"])
def test_a_decode_graph_of_a_chatglm2_is_refused_in_one_line_before_reading(finetuned, tmp_path, capsys, flag,
                                                                            monkeypatch):
    from glm_port.models.chatglm2 import weights

    monkeypatch.setattr(weights, "load_pretrained", lambda *a, **k: pytest.fail("the model was loaded"))
    base, _ = finetuned
    with pytest.raises(SystemExit) as exc:
        export_main(["--model_name_or_path", str(base), flag, "--output_path", str(tmp_path / "out")])
    err = capsys.readouterr().err.strip().splitlines()
    assert exc.value.code == 2 and err == [
        f"glm-export: error: {flag}: the chatglm2 family does not support a decode-step graph (ONNX, torch.export)"]
    assert not (tmp_path / "out").exists()


def test_glm_export_folds_an_adapter_into_chatglm2_tensor_parallel_shards(finetuned, tmp_path, capsys):
    """The base as glm-finetune --tensor_parallel_degree 2 saves a ChatGLM2 (mp_rank_XX files carrying the
    config, the tokenizer beside them): glm-export reads it merged and folds the adapter in alike."""
    import peft

    from glm_port.checkpoint_io import TRACKER, model_file_name
    from glm_port.models.chatglm2.weights import load_pretrained, load_tokenizer, tensor_parallel_slice

    base, adapter = finetuned
    model = load_pretrained(base)
    (tmp_path / "tp" / "3").mkdir(parents=True)
    for rank in range(2):
        module = {name: tensor_parallel_slice(name, full, model.config, rank, 2).clone()
                  for name, full in model.state_dict().items()}
        torch.save({"iteration": 3, "module": module, "glm_config": model.config.to_dict()},
                   tmp_path / "tp" / "3" / model_file_name(rank))
    (tmp_path / "tp" / TRACKER).write_text("3")
    load_tokenizer(base).save_pretrained(tmp_path / "tp")
    export_main(["--model_name_or_path", str(tmp_path / "tp"), "--lora_path", str(adapter), "--output_path",
                 str(tmp_path / "out")])
    assert "warning" not in capsys.readouterr().err  # the same weights as the base the adapter recorded
    with torch.no_grad():
        adapted = peft.PeftModel.from_pretrained(model, str(adapter)).eval()(input_ids=IDS).logits
        torch.testing.assert_close(load_pretrained(tmp_path / "out")(IDS).logits, adapted, rtol=1e-5, atol=1e-5)
