"""Under tensor parallel 4 (gloo, 4 processes), every split layer of both families holds the split its
family's plan gives its weight (``parallel``, ``stride``, ``sections``, ``section_replicas``: ChatGLM2's 2
key/value groups each on 2 ranks), and each rank's local weight is the plan's slice of the whole."""

import pytest
import torch

import shim.distributed as sdist

CHATGLM2 = dict(num_layers=2, hidden_size=64, ffn_hidden_size=96, kv_channels=16, num_attention_heads=4,
                multi_query_group_num=2, padded_vocab_size=128, seq_length=64)


def _check(split_model, whole_model, plan):
    import torch.distributed as dist

    from shim.nn.split_plan import Split
    from shim.nn.tensor_parallel import Linear1D, VocabParallelEmbedding

    whole = whole_model.state_dict()
    rank, seen = dist.get_rank(), 0
    for name, module in split_model.named_modules():
        if not isinstance(module, (Linear1D, VocabParallelEmbedding)):
            continue
        split = plan.split_for(f"{name}.weight")
        if isinstance(module, Linear1D):
            assert Split.of_layer(module) == split, name
            if module.bias is not None:
                assert plan.split_for(f"{name}.bias") == split.bias, name
        else:
            assert split == Split(0), name
        local = module.weight.to_local()
        assert torch.equal(local, plan.slice(f"{name}.weight", whole[f"{name}.weight"], rank, 4)), name
        seen += 1
    return seen


def check_chatglm2_layers_hold_the_plan_split():
    from glm_port.models.chatglm2 import ChatGLM2Config, ChatGLM2ForCausalLM
    from glm_port.models.chatglm2.splits import split_plan
    from glm_port.models.chatglm2.weights import load_tensor_parallel

    config = ChatGLM2Config(**CHATGLM2)
    torch.manual_seed(0)
    whole = ChatGLM2ForCausalLM(config)
    sdist.setup_dist_util(tensor_parallel_size=4)
    try:
        split = ChatGLM2ForCausalLM(config)
    finally:
        sdist.reset_dist_util()
    load_tensor_parallel(split, whole.state_dict())
    qkv = split.transformer.encoder.layers[0].self_attention.query_key_value
    assert qkv.output_replicas == (1, 2, 2)
    assert _check(split, whole, split_plan(config, 4)) == 4 * config.num_layers


def check_glm_layers_hold_the_plan_split():
    from glm_port.models.glm.config import GLMConfig
    from glm_port.models.glm.model import GLMModel
    from glm_port.models.glm.splits import SPLIT_PLAN

    config = GLMConfig(vocab_size=64, num_layers=2, hidden_size=32, num_attention_heads=4, max_sequence_length=16)
    torch.manual_seed(0)
    whole = GLMModel(config)
    sdist.setup_dist_util(tensor_parallel_size=4)
    try:
        torch.manual_seed(0)  # the same init: Linear1D initialises the whole weight, then scatters rank 0's
        split = GLMModel(config)
    finally:
        sdist.reset_dist_util()
    assert _check(split, whole, SPLIT_PLAN) == 1 + 4 * config.num_layers


CHECKS = {name: check for name, check in globals().items() if name.startswith("check_")}


@pytest.fixture(scope="module")
def four_ranks(launch):
    return launch(CHECKS, world_size=4)


@pytest.mark.parametrize("name", list(CHECKS))
def test_on_four_ranks(four_ranks, name):
    four_ranks.assert_passed(name)
