"""Issue 31 wired into the commands: ``--quantize int8|int4`` on glm-generate and glm-chat,
``load_pretrained(quantize=)`` / ``GLMForConditionalGeneration.from_pretrained(quantize=)``, and THUDM's
``quantization_bit`` directories (int8 / packed-int4 tensors with a per-row ``weight_scale``, or float
weights quantized at load) read as they are."""

import copy
import io
import json
import sys

import pytest
import torch

from glm_port import chat as glm_chat
from glm_port.generation import cli
from glm_port.models.chatglm2.weights import QUANTIZED_LINEARS, WeightsError, load_pretrained, save_sharded
from shim.nn import Int4Linear, Int8Linear
from shim.nn.quantized import dequantize_thudm, quantize_thudm

VOCAB = 1024


def relative(got, ref):
    """||got - ref|| / ||ref|| over every logit (Frobenius norms): the metric of docs/quantization.md, Quality."""
    return ((got.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from glm_port.models.chatglm2.tiny import build_tokenizer

    from .conftest import small_model, write_thudm_dir

    directory = write_thudm_dir(small_model(padded_vocab_size=VOCAB, std=0.05), tmp_path_factory.mktemp("m"),
                                shards=1)
    build_tokenizer(str(directory))
    return directory


def generate(argv):
    out, err = io.StringIO(), io.StringIO()
    cli.run(cli.build_parser().parse_args(argv), out=out, err=err)
    return [json.loads(line)["generated_ids"] for line in out.getvalue().splitlines()]


def ids():
    return torch.randint(3, VOCAB, (2, 10), generator=torch.Generator().manual_seed(1))


def test_load_pretrained_quantize_keeps_the_output_layer_and_the_logits(model_dir):
    ref = load_pretrained(model_dir)
    with torch.inference_mode():
        expected = ref(input_ids=ids()).logits
    for mode, kind, bound in (("int8", Int8Linear, 1e-2), ("int4", Int4Linear, 5e-2)):
        model = load_pretrained(model_dir, quantize=mode, group_size=32)
        layer = model.transformer.encoder.layers[0]
        assert isinstance(layer.self_attention.query_key_value, kind) and isinstance(layer.mlp.dense_4h_to_h, kind)
        assert type(model.transformer.output_layer) is torch.nn.Linear  # kept in float, as THUDM's
        with torch.inference_mode():
            assert relative(model(input_ids=ids()).logits, expected) < bound, mode


def test_generate_quantize_int8_gives_the_fp32_tokens(model_dir):
    base = ["--model", str(model_dir), "--json", "--max-new-tokens", "8", "你好", "Beijing is the capital of"]
    fp32 = generate(base)
    assert generate([*base, "--quantize", "int8"]) == fp32
    assert len(generate([*base, "--quantize", "int4", "--quantize-group-size", "32"])) == 2  # runs


def test_glm_from_pretrained_quantize(tmp_path):
    from glm_port import GLMConfig, GLMModel
    from glm_port.checkpoint_io import save_checkpoint
    from glm_port.models.glm.hf import GLMForConditionalGeneration

    config = GLMConfig(vocab_size=256, num_layers=2, hidden_size=64, num_attention_heads=4, max_sequence_length=32)
    torch.manual_seed(0)
    save_checkpoint(tmp_path, 1, GLMModel(config).state_dict(), config=config)
    ref = GLMForConditionalGeneration.from_pretrained(tmp_path, dtype=torch.float32)
    model = GLMForConditionalGeneration.from_pretrained(tmp_path, dtype=torch.float32, quantize="int8")
    assert sum(isinstance(m, Int8Linear) for m in model.modules()) == 2 * 4
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.inference_mode():
        assert relative(model(tokens).logits, ref(tokens).logits) < 1e-2
    with pytest.raises(ValueError, match="--quantize-group-size applies to --quantize int4"):
        GLMForConditionalGeneration.from_pretrained(tmp_path, quantize="int8", quantize_group_size=32)


@pytest.mark.parametrize("argv, message", [
    (["--quantize", "int4", "--quantize-group-size", "64"], "int4 group size 64 does not divide the row of 96"),
    (["--quantize", "int4", "--quantize-group-size", "48"], "--quantize-group-size must be one of 32, 64, 128"),
    (["--quantize", "int8", "--quantize-group-size", "32"], "--quantize-group-size applies to --quantize int4"),
    (["--quantize-group-size", "32"], "--quantize-group-size needs --quantize int4"),
    (["--quantize", "int8", "--tensor-parallel-size", "2"], "--quantize int8: not with --tensor-parallel-size"),
])
def test_generate_refusals_are_one_line_exit_2(model_dir, argv, message, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["--model", str(model_dir), *argv, "hi"])
    assert stop.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("glm-generate: error: ") and message in err and "\n" not in err, err


def test_generate_unknown_quantize_value_exits_2(model_dir, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["--model", str(model_dir), "--quantize", "int3", "hi"])
    assert stop.value.code == 2 and "invalid choice: 'int3'" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--quantize", "int8", "--quantize-group-size", "32"], "--quantize-group-size applies to --quantize int4"),
    (["--quantize-group-size", "32"], "--quantize-group-size needs --quantize int4"),
])
def test_chat_refusals_before_loading(argv, message, capsys, monkeypatch):
    monkeypatch.setattr(glm_chat, "load", lambda *a, **k: pytest.fail("loaded before the options were checked"))
    assert glm_chat.main([*argv, "--prompt", "hi"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"glm-chat: error: {message}" or (message in err and "\n" not in err), err


def test_chat_quantize_int8_answers_as_fp32(model_dir, capsys):
    argv = ["--model", str(model_dir), "--greedy", "--max-new-tokens", "6", "--prompt", "你好"]
    assert glm_chat.main(argv) == 0
    fp32 = capsys.readouterr().out
    assert glm_chat.main([*argv, "--quantize", "int8"]) == 0
    assert capsys.readouterr().out == fp32
    assert glm_chat.main([*argv, "--quantize", "int4", "--quantize-group-size", "64"]) == 2
    assert "does not divide the row of 96" in capsys.readouterr().err


# ---------------------------------------------------------------- THUDM's quantization_bit directories
def write_quantized(model, directory, bits, drop=None, bad_shape=None):
    """``model`` saved as THUDM's chatglm2-6b-int4 is: the layers' four linears as int8 tensors (two int4
    values a byte for 4 bits) with a per-row float16 ``weight_scale``, the rest float16; config.json with
    ``quantization_bit``."""
    state = {}
    for name, tensor in model.state_dict().items():
        state[name] = tensor.half()
    for index in range(model.config.num_layers):
        for path in QUANTIZED_LINEARS:
            key = f"transformer.encoder.layers.{index}.{path}"
            weight, scale = quantize_thudm(state[f"{key}.weight"], bits)
            state[f"{key}.weight"], state[f"{key}.weight_scale"] = weight, scale.half()
    if drop:
        del state[drop]
    if bad_shape:
        state[bad_shape] = state[bad_shape][:-1]
    directory.mkdir()
    save_sharded(state, directory, shards=1, fmt="safetensors")
    config = copy.deepcopy(model.config)
    config.quantization_bit = bits
    config.save_pretrained(directory)
    return state


def dequantized_reference(model, state, bits):
    """The model with THUDM's dequantized weights (``dequantize_thudm``), float32, every other tensor as saved."""
    ref = copy.deepcopy(model).float()
    with torch.no_grad():
        for name, param in ref.named_parameters():
            if name.endswith(".weight") and f"{name}_scale" in state:
                param.copy_(dequantize_thudm(state[name], state[f"{name}_scale"].float(), bits))
            else:
                param.copy_(state[name].float())
    return ref


@pytest.mark.parametrize("bits", [8, 4])
def test_thudm_quantized_directory_loads_as_published(tmp_path, bits):
    from .conftest import small_model

    model = small_model(padded_vocab_size=128, std=0.05)
    state = write_quantized(model, tmp_path / "q", bits)
    loaded = load_pretrained(tmp_path / "q", dtype=torch.float32)
    kind = Int8Linear if bits == 8 else Int4Linear
    assert isinstance(loaded.transformer.encoder.layers[1].mlp.dense_h_to_4h, kind)
    with torch.inference_mode():
        got = loaded(input_ids=ids() % 128).logits
        expected = dequantized_reference(model, state, bits)(input_ids=ids() % 128).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


def test_quantization_bit_on_a_full_precision_directory_quantizes_at_load(tmp_path, write_thudm):
    """THUDM's recipe (``quantize_thudm``: per-row absmax) applied to the weights as loaded (float32 here)."""
    from .conftest import small_model

    model = small_model(padded_vocab_size=128, std=0.05).half().float()
    directory = write_thudm(model, tmp_path / "f", shards=1)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "quantization_bit": 4}))
    loaded = load_pretrained(directory, dtype=torch.float32)
    assert isinstance(loaded.transformer.encoder.layers[0].self_attention.dense, Int4Linear)
    state = dict(model.state_dict())
    for name in list(state):
        if any(f".{path}.weight" in name for path in QUANTIZED_LINEARS):
            state[name], state[f"{name}_scale"] = quantize_thudm(state[name], 4)
    with torch.inference_mode():
        got = loaded(input_ids=ids() % 128).logits
        expected = dequantized_reference(model, state, 4)(input_ids=ids() % 128).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("fault, message", [
    ("drop", "self_attention.dense.weight_scale missing from a quantization_bit=8 checkpoint"),
    ("bad_shape", "transformer.encoder.layers.0.mlp.dense_4h_to_h: "),
])
def test_a_quantized_checkpoint_with_bad_scales_is_one_line(tmp_path, fault, message):
    from .conftest import small_model

    key = ("transformer.encoder.layers.1.self_attention.dense.weight_scale" if fault == "drop"
           else "transformer.encoder.layers.0.mlp.dense_4h_to_h.weight_scale")
    write_quantized(small_model(padded_vocab_size=128), tmp_path / "q", 8, **{fault: key})
    with pytest.raises(WeightsError, match=message) as error:
        load_pretrained(tmp_path / "q")
    assert "\n" not in str(error.value)


def test_quantization_bit_out_of_range_is_one_line(tmp_path, write_thudm):
    from .conftest import small_model

    directory = write_thudm(small_model(padded_vocab_size=128), tmp_path / "f", shards=1)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "quantization_bit": 3}))
    with pytest.raises(WeightsError, match="quantization_bit=3: expected 4 or 8"):
        load_pretrained(directory)


@pytest.mark.parametrize("argv", [["--quantize", "int8"], ["--quantize=int4"]])
def test_finetune_refuses_quantize(argv, capsys):
    from glm_port.finetune.arguments import parse_args

    with pytest.raises(SystemExit) as stop:
        parse_args(["--model_name_or_path", "chatglm2-tiny", *argv])
    assert stop.value.code == 2
    assert "error: --quantize is not supported: quantized layers are for inference" in capsys.readouterr().err


@pytest.mark.parametrize("mode, bits", [("int8", 8), ("int4", 4)])
def test_glm_export_quantize_writes_thudms_layout_that_loads_without_requantizing(model_dir, tmp_path, capsys,
                                                                                 monkeypatch, mode, bits):
    import shim.nn.quantized as quantized
    from safetensors.torch import load_file

    from glm_port.convert.export import main as export_main

    export_main(["--model_name_or_path", str(model_dir), "--output_path", str(tmp_path / "out"), "--dtype", "fp16",
                 "--quantize", mode])
    capsys.readouterr()
    assert json.loads((tmp_path / "out" / "config.json").read_text())["quantization_bit"] == bits
    state = load_file(tmp_path / "out" / "model.safetensors")
    qkv = "transformer.encoder.layers.0.self_attention.query_key_value.weight"
    assert state[qkv].dtype == torch.int8 and state[f"{qkv}_scale"].dtype == torch.float16
    assert state["transformer.output_layer.weight"].dtype == torch.float16
    monkeypatch.setattr(quantized, "quantize_thudm", lambda *a: pytest.fail("re-quantized at load"))
    loaded = load_pretrained(tmp_path / "out", dtype=torch.float32)
    kind = Int8Linear if bits == 8 else Int4Linear
    assert isinstance(loaded.transformer.encoder.layers[1].mlp.dense_4h_to_h, kind)
    reference = dequantized_reference(load_pretrained(model_dir), state, bits)
    with torch.inference_mode():
        torch.testing.assert_close(loaded(input_ids=ids()).logits, reference(input_ids=ids()).logits,
                                   rtol=1e-5, atol=1e-5)


def test_glm_export_quantize_of_a_glm_is_one_line(tmp_path, capsys):
    from glm_port import GLMConfig, GLMModel
    from glm_port.checkpoint_io import save_checkpoint
    from glm_port.convert.export import main as export_main

    config = GLMConfig(vocab_size=256, num_layers=1, hidden_size=64, num_attention_heads=4, max_sequence_length=32)
    save_checkpoint(tmp_path / "g", 1, GLMModel(config).state_dict(), config=config)
    with pytest.raises(SystemExit) as stop:
        export_main(["--model_name_or_path", str(tmp_path / "g"), "--output_path", str(tmp_path / "o"),
                     "--quantize", "int8"])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and "\n" not in err and "glm-export writes quantized weights for ChatGLM2 only" in err
    assert not (tmp_path / "o").exists()
