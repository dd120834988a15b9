"""A finetune binding's ``load(..., meta=True)`` (what a sharded run's ranks build before rank 0's weights fill
their shards, ``glm_port.sharding.shard_from_rank0``): the model ``load`` gives, same class, names, shapes,
settings and buffers, every tensor on the meta device (fp32), for the embedded model and a saved directory."""

import importlib

import pytest
import torch


def _assert_same_model(real, meta):
    assert type(meta) is type(real)
    assert meta.config.to_dict() == real.config.to_dict() if hasattr(real.config, "to_dict") else \
        meta.config == real.config
    real_state, meta_state = real.state_dict(), meta.state_dict()
    assert list(meta_state) == list(real_state)
    for name, tensor in meta_state.items():
        assert tensor.is_meta and tensor.shape == real_state[name].shape, name
        assert tensor.dtype == torch.float32, name
    assert [n for n, _ in meta.named_buffers()] == [n for n, _ in real.named_buffers()]
    assert meta.training == real.training


@pytest.mark.parametrize("family", ["glm", "chatglm2", "glm4"])
def test_load_meta_builds_the_loaded_model_without_weights(tmp_path, family):
    binding = importlib.import_module(f"glm_port.models.{family}.finetune")
    model, tokenizer = binding.load(None, "cpu")
    meta, meta_tokenizer = binding.load(None, "cpu", meta=True)
    _assert_same_model(model, meta)
    assert type(meta_tokenizer) is type(tokenizer)
    binding.save(model, tokenizer, tmp_path / "saved", None)
    loaded, _ = binding.load(tmp_path / "saved", "cpu", recompute=True)
    meta, _ = binding.load(tmp_path / "saved", "cpu", recompute=True, meta=True)
    _assert_same_model(loaded, meta)
