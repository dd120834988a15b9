"""ChatGLM2 under tensor parallel 2 (gloo, 2 processes) = one process: logits, padded batches, decoding with
the cache (fp32, 1e-5); query heads split, the 2 key/value groups one per rank, SwiGLU halves split together;
glm-generate's loader reading each rank's slices from a directory gives the same tokens."""

import pytest
import torch

import shim.distributed as sdist

TOL = dict(rtol=1e-5, atol=1e-5)
SMALL = dict(num_layers=2, hidden_size=64, ffn_hidden_size=96, kv_channels=16, num_attention_heads=4,
             multi_query_group_num=2, padded_vocab_size=128, seq_length=64)


def _pair(**overrides):
    from glm_port.models.chatglm2 import ChatGLM2Config, ChatGLM2ForCausalLM
    from glm_port.models.chatglm2.weights import load_tensor_parallel

    config = ChatGLM2Config(**{**SMALL, **overrides})
    torch.manual_seed(0)
    whole = ChatGLM2ForCausalLM(config).eval()  # built before any layout: plain layers
    with torch.no_grad():
        for p in whole.parameters():
            p.normal_(0, 0.3)
    sdist.setup_dist_util(tensor_parallel_size=2)
    try:
        split = ChatGLM2ForCausalLM(config).eval()
    finally:
        sdist.reset_dist_util()
    load_tensor_parallel(split, whole.state_dict())
    return whole, split


def check_layers_are_split():
    from torch.distributed.tensor import DTensor

    _, split = _pair()
    attn = split.transformer.encoder.layers[0].self_attention
    assert (attn.num_heads, attn.num_groups) == (2, 1)
    assert isinstance(attn.query_key_value.weight, DTensor)
    assert attn.query_key_value.weight.to_local().shape == ((2 + 2 * 1) * 16, 64)
    assert split.transformer.encoder.layers[0].mlp.dense_h_to_4h.weight.to_local().shape == (96, 64)


def check_logits_and_padding():
    whole, split = _pair()
    ids = torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        torch.testing.assert_close(split(ids).logits, whole(ids).logits, **TOL)
        torch.testing.assert_close(split(ids, attention_mask=mask, position_ids=positions).logits,
                                   whole(ids, attention_mask=mask, position_ids=positions).logits, **TOL)


def check_decoding_with_cache():
    whole, split = _pair()
    ids = torch.randint(3, 128, (2, 8), generator=torch.Generator().manual_seed(2))
    kw = dict(max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        assert torch.equal(split.generate(ids, **kw), whole.generate(ids, **kw))
        a, b = whole(ids, use_cache=True), split(ids, use_cache=True)
        token = a.logits[:, -1:].argmax(-1)
        torch.testing.assert_close(split(token, cache=b.cache).logits, whole(token, cache=a.cache).logits, **TOL)


def check_without_multi_query_attention():
    whole, split = _pair(multi_query_attention=False)
    ids = torch.randint(3, 128, (1, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(split(ids).logits, whole(ids).logits, **TOL)


def check_glm_generate_loads_split_weights():
    import shutil
    import tempfile

    import torch.distributed as dist

    from glm_port.generation.parallel import ModelParallel
    from glm_port.models.chatglm2 import generation
    from glm_port.models.chatglm2.tiny import build_tiny
    from glm_port.models.chatglm2.weights import save_sharded

    whole, tok = build_tiny()
    directory = tempfile.mkdtemp(prefix=f"chatglm2-tp-{dist.get_rank()}-")
    save_sharded(dict(whole.state_dict()), directory, shards=2, fmt="safetensors")
    whole.config.save_pretrained(directory)
    tok.save_pretrained(directory)
    sdist.setup_dist_util(tensor_parallel_size=2)
    try:
        split, _ = generation.load(directory, dtype="fp32", device="cpu", tensor_parallel=ModelParallel(2, dist.get_rank()))
    finally:
        sdist.reset_dist_util()
        shutil.rmtree(directory, ignore_errors=True)
    prompts = ["你好", "Mira is the fisher of the valley."]
    ours = generation.generate(split, tok, prompts, max_new_tokens=5, do_sample=False)
    reference = generation.generate(whole, tok, prompts, max_new_tokens=5, do_sample=False)
    assert [r["generated_ids"] for r in ours] == [r["generated_ids"] for r in reference]


CHECKS = {name: check for name, check in globals().items() if name.startswith("check_")}


@pytest.fixture(scope="module")
def two_ranks(launch):
    return launch(CHECKS)


@pytest.mark.parametrize("name", list(CHECKS))
def test_on_two_ranks(two_ranks, name):
    two_ranks.assert_passed(name)
