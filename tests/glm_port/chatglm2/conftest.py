"""Small random ChatGLM2 models for the family's tests (built here; no downloads)."""

import pytest
import torch

from glm_port.models.chatglm2 import ChatGLM2Config, ChatGLM2ForCausalLM
from glm_port.models.chatglm2.weights import save_sharded

SMALL = dict(num_layers=2, hidden_size=64, ffn_hidden_size=96, kv_channels=16, num_attention_heads=4,
             multi_query_group_num=2, padded_vocab_size=128, seq_length=64)


def small_model(seed=0, std=0.3, **overrides):
    """A ChatGLM2-layout model whose every weight (norms and biases too) is random, so no term hides."""
    config = ChatGLM2Config(**{**SMALL, **overrides})
    torch.manual_seed(seed)
    model = ChatGLM2ForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, std)
    return model


def write_thudm_dir(model, directory, shards=2, fmt="bin", inv_freq=True):
    """The model saved as THUDM publishes ChatGLM2: sharded .bin + index, config.json, rotary inv_freq included."""
    state = dict(model.state_dict())
    if inv_freq:
        d = model.config.kv_channels // 2
        state["transformer.rotary_pos_emb.inv_freq"] = 1.0 / 10000 ** (torch.arange(0, d, 2).float() / d)
    save_sharded(state, directory, shards=shards, fmt=fmt)
    model.config.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def model():
    return small_model()


@pytest.fixture(scope="module")
def tiny():
    from glm_port.models.chatglm2.tiny import build_tiny

    return build_tiny()


@pytest.fixture(scope="session")
def make_model():
    return small_model


@pytest.fixture(scope="session")
def write_thudm():
    return write_thudm_dir
