"""Reading ChatGLM2 directories as THUDM publishes them (sharded .bin + index, or safetensors), to a dtype,
and the one-line errors for an unknown family, a missing shard, a missing weight."""

import json
import os

import pytest
import torch

from glm_port.models.chatglm2.weights import WeightsError, load_pretrained, read_config


@pytest.mark.parametrize("fmt", ["bin", "safetensors"])
def test_sharded_directory_loads_to_dtype(tmp_path, model, write_thudm, fmt):
    write_thudm(model, tmp_path, shards=3, fmt=fmt)
    loaded = load_pretrained(tmp_path, dtype=torch.bfloat16)
    assert loaded.dtype == torch.bfloat16 and not loaded.training
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, model.state_dict()[name].to(torch.bfloat16)), name


def test_thudm_config_json_reads_as_is(tmp_path):
    # chatglm2-6b's config.json fields (with its auto_map for remote code, which we do not need)
    raw = {"model_type": "chatglm", "architectures": ["ChatGLMModel"], "auto_map": {"AutoConfig": "x.y"},
           "add_bias_linear": False, "add_qkv_bias": True, "apply_query_key_layer_scaling": True,
           "apply_residual_connection_post_layernorm": False, "attention_dropout": 0.0,
           "attention_softmax_in_fp32": True, "bias_dropout_fusion": True, "ffn_hidden_size": 13696,
           "fp32_residual_connection": False, "hidden_dropout": 0.0, "hidden_size": 4096, "kv_channels": 128,
           "layernorm_epsilon": 1e-05, "multi_query_attention": True, "multi_query_group_num": 2,
           "num_attention_heads": 32, "num_layers": 28, "original_rope": True, "padded_vocab_size": 65024,
           "post_layer_norm": True, "rmsnorm": True, "seq_length": 32768, "use_cache": True,
           "torch_dtype": "float16", "transformers_version": "4.27.1", "tie_word_embeddings": False,
           "eos_token_id": 2, "pad_token_id": 0}
    (tmp_path / "config.json").write_text(json.dumps(raw))
    config = read_config(tmp_path)
    assert (config.num_layers, config.num_key_value_heads, config.kv_channels, config.vocab_size) == (28, 2, 128, 65024)
    assert config.num_hidden_layers == 28 and config.rope_ratio == 1.0


def _one_line(exc_info, *parts):
    message = str(exc_info.value)
    assert "\n" not in message and all(p in message for p in parts), message


def test_missing_shard(tmp_path, model, write_thudm):
    write_thudm(model, tmp_path, shards=3)
    os.remove(tmp_path / "pytorch_model-00002-of-00003.bin")
    with pytest.raises(WeightsError) as exc:
        load_pretrained(tmp_path)
    _one_line(exc, "pytorch_model-00002-of-00003.bin", "missing")


def test_missing_weight(tmp_path, model, write_thudm):
    write_thudm(model, tmp_path, shards=2)
    index = json.loads((tmp_path / "pytorch_model.bin.index.json").read_text())
    del index["weight_map"]["transformer.encoder.layers.1.mlp.dense_4h_to_h.weight"]
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    with pytest.raises(WeightsError) as exc:
        load_pretrained(tmp_path)
    _one_line(exc, "transformer.encoder.layers.1.mlp.dense_4h_to_h.weight missing")


def test_a_weight_of_another_shape_is_one_line_naming_it(tmp_path, model, write_thudm):
    """Read by the shared reader into a model built on meta: a tensor of another shape than the config gives is a
    WeightsError naming the weight and both shapes (transformers' from_pretrained, which read it before, raised a
    RuntimeError of many lines)."""
    name = "transformer.encoder.layers.0.mlp.dense_4h_to_h.weight"
    state = dict(model.state_dict())
    state[name] = state[name][:, :-1].clone()
    from glm_port.models.chatglm2.weights import save_sharded

    save_sharded(state, tmp_path, shards=2, fmt="safetensors")
    model.config.save_pretrained(tmp_path)
    with pytest.raises(WeightsError) as exc:
        load_pretrained(tmp_path)
    _one_line(exc, f"{tmp_path}: {name} is {list(state[name].shape)}, the config gives")


def test_unknown_family(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    with pytest.raises(WeightsError) as exc:
        load_pretrained(tmp_path)
    _one_line(exc, "model_type 'llama' is not a ChatGLM2-family model")


def test_save_pretrained_round_trip(tmp_path, model):
    model.save_pretrained(tmp_path)
    loaded = load_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["model_type"] == "chatglm"
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(tensor, model.state_dict()[name]), name


@pytest.mark.parametrize("family", ["chatglm2", "glm4"])
def test_a_ptuning_checkpoint_beside_tensor_parallel_shards_is_one_line(tmp_path, monkeypatch, family):
    # both families' check_directory answer tensor-parallel shards the same way (chatglm2.weights.shards_config)
    import importlib
    from types import SimpleNamespace

    from glm_port.models.chatglm2.config import ChatGLM2Config

    weights = importlib.import_module(f"glm_port.models.{family}.weights")
    config = ChatGLM2Config(num_layers=1, hidden_size=64, num_attention_heads=4, kv_channels=16,
                            ffn_hidden_size=96, padded_vocab_size=128)
    monkeypatch.setattr(weights, "tensor_parallel_checkpoint", lambda directory: SimpleNamespace(config=config))
    assert weights.check_directory(tmp_path).num_layers == 1
    with pytest.raises(WeightsError, match="tensor-parallel shards; a P-Tuning checkpoint goes with one directory"):
        weights.check_directory(tmp_path, ptuning_checkpoint=tmp_path / "ptuning")
