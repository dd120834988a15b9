"""Each family's tensor-parallel split plan (issue 27): one table the loaders slice and merge by and the
models build their split layers from. Round trip (every rank's slice, merged, is the whole tensor) over every
weight of tiny models, ChatGLM2's fused ``[Q | K | V]`` with key/value groups (replicated at T > G)
included; every ``Linear1D`` holds the split the plan gives its weight (under tensor parallel 4:
tests/distributed/test_split_plan_layers.py)."""

import pytest
import torch

from glm_port.models.chatglm2 import ChatGLM2Config, ChatGLM2ForCausalLM
from glm_port.models.chatglm2 import splits as chatglm2_splits
from glm_port.models.chatglm2.weights import tensor_parallel_merge, tensor_parallel_slice
from glm_port.models.glm import splits as glm_splits
from glm_port.models.glm import weights as glm_weights
from glm_port.models.glm.config import GLMConfig
from glm_port.models.glm.model import GLMModel
from shim.nn.split_plan import REPLICATED, Split
from shim.nn.tensor_parallel import Linear1D, VocabParallelEmbedding

GLM = GLMConfig(vocab_size=64, num_layers=2, hidden_size=32, num_attention_heads=4, max_sequence_length=16)
CHATGLM2 = dict(num_layers=2, hidden_size=64, ffn_hidden_size=96, kv_channels=16, num_attention_heads=4,
                multi_query_group_num=2, padded_vocab_size=128, seq_length=64)


def _glm_state():
    torch.manual_seed(0)
    return GLMModel(GLM).state_dict()


def _chatglm2(**overrides):
    torch.manual_seed(0)
    model = ChatGLM2ForCausalLM(ChatGLM2Config(**{**CHATGLM2, **overrides}))
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    return model


@pytest.mark.parametrize("size", [1, 2, 4])
def test_glm_plan_round_trip(size):
    plan = glm_splits.split_plan(GLM, size)
    split_keys = 0
    for name, whole in _glm_state().items():
        parts = [glm_weights.take_slice(name, whole, size, rank) for rank in range(size)]
        assert all(torch.equal(p, plan.slice(name, whole, r, size)) for r, p in enumerate(parts)), name
        assert torch.equal(glm_weights.merge_slices(name, parts), whole), name
        assert torch.equal(plan.merge(name, parts), whole), name
        split_keys += plan.split_for(name) is not REPLICATED
    assert split_keys == 1 + 6 * GLM.num_layers  # the embeddings; a layer's QKV and h->4h weight and bias, 2 row weights


@pytest.mark.parametrize("overrides, size", [
    ({}, 1), ({}, 2),
    ({}, 4),  # 2 key/value groups on 4 ranks: each group held by 2
    ({"multi_query_group_num": 1}, 4),  # one group on every rank
    ({"multi_query_attention": False}, 2),  # per-head [q; k; v] blocks
    ({"add_bias_linear": True}, 2),
])
def test_chatglm2_plan_round_trip_with_key_value_groups(overrides, size):
    model = _chatglm2(**overrides)
    plan = chatglm2_splits.split_plan(model.config, size)
    for name, whole in model.state_dict().items():
        parts = [tensor_parallel_slice(name, whole, model.config, rank, size) for rank in range(size)]
        assert all(torch.equal(p, plan.slice(name, whole, r, size)) for r, p in enumerate(parts)), name
        assert torch.equal(tensor_parallel_merge(name, parts, model.config), whole), name
        assert torch.equal(plan.merge(name, parts), whole), name


def test_chatglm2_qkv_split_follows_heads_groups_and_size():
    config = ChatGLM2Config(**CHATGLM2)
    sections = (4 * 16, 2 * 16, 2 * 16)
    assert chatglm2_splits.qkv_split(config, 2) == Split(0, sections=sections)
    assert chatglm2_splits.qkv_split(config, 4) == Split(0, sections=sections, section_replicas=(1, 2, 2))
    name = "transformer.encoder.layers.1.self_attention.query_key_value.weight"
    assert chatglm2_splits.split_plan(config, 4).split_for(name) == chatglm2_splits.qkv_split(config, 4)
    whole = torch.arange(128.).view(128, 1)
    # rank 3: query head 3, then key and value group 1 (ranks 2 and 3 hold it)
    assert tensor_parallel_slice(name, whole, config, 3, 4).flatten().tolist() == \
        list(range(48, 64)) + list(range(80, 96)) + list(range(112, 128))


def _check_layers(model, plan, prefix=""):
    seen = 0
    for name, module in model.named_modules():
        key = prefix + name
        if isinstance(module, Linear1D):
            split = plan.split_for(f"{key}.weight")
            assert Split.of_layer(module) == split, key
            if module.bias is not None:
                assert plan.split_for(f"{key}.bias") == split.bias, key
            seen += 1
        elif isinstance(module, VocabParallelEmbedding):
            assert plan.split_for(f"{key}.weight") == Split(0), key
    return seen


def test_every_glm_linear_holds_its_plan_split():
    assert _check_layers(GLMModel(GLM), glm_splits.SPLIT_PLAN) == 4 * GLM.num_layers


@pytest.mark.parametrize("overrides", [{}, {"multi_query_attention": False}, {"add_bias_linear": True}])
def test_every_chatglm2_linear_holds_its_plan_split(overrides):
    model = ChatGLM2ForCausalLM(ChatGLM2Config(**{**CHATGLM2, **overrides}))
    assert _check_layers(model, chatglm2_splits.split_plan(model.config, 1)) == 4 * model.config.num_layers
