"""ChatGLM2 under tensor parallel 2 (gloo, 2 processes) = one process: logits, padded batches, decoding with
the cache (fp32, 1e-5); query heads split, the 2 key/value groups one per rank, SwiGLU halves split together;
glm-generate's loader reading each rank's slices from a directory gives the same tokens.

Tensor parallel 4 on the same 2 groups (gloo, 4 processes): each group replicated on 2 ranks (rank r holds
query head r and group r // 2), the same logits, padded batches, cached decoding, greedy tokens and
directory loading; gradients and the clipped norm of one process; an impossible degree is one line."""

import pytest
import torch

import shim.distributed as sdist
from glm_port.models.chatglm2.config import CACHE_KWARG as CACHE  # "cache", or "past_key_values" before transformers 5.2x

TOL = dict(rtol=1e-5, atol=1e-5)
SMALL = dict(num_layers=2, hidden_size=64, ffn_hidden_size=96, kv_channels=16, num_attention_heads=4,
             multi_query_group_num=2, padded_vocab_size=128, seq_length=64)


def _pair(tp=2, **overrides):
    from glm_port.models.chatglm2 import ChatGLM2Config, ChatGLM2ForCausalLM
    from glm_port.models.chatglm2.weights import load_tensor_parallel

    config = ChatGLM2Config(**{**SMALL, **overrides})
    torch.manual_seed(0)
    whole = ChatGLM2ForCausalLM(config).eval()  # built before any layout: plain layers
    with torch.no_grad():
        for p in whole.parameters():
            p.normal_(0, 0.3)
    sdist.setup_dist_util(tensor_parallel_size=tp)
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


def check_logits_and_padding(tp=2):
    whole, split = _pair(tp=tp)
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
        torch.testing.assert_close(split(token, cache=getattr(b, CACHE)).logits, whole(token, cache=getattr(a, CACHE)).logits, **TOL)


def check_without_multi_query_attention():
    whole, split = _pair(multi_query_attention=False)
    ids = torch.randint(3, 128, (1, 10), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        torch.testing.assert_close(split(ids).logits, whole(ids).logits, **TOL)


def check_glm_generate_loads_split_weights(tp=2):
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
    sdist.setup_dist_util(tensor_parallel_size=tp)
    try:
        split, _ = generation.load(directory, dtype="fp32", device="cpu", tensor_parallel=ModelParallel(tp, dist.get_rank()))
    finally:
        sdist.reset_dist_util()
        shutil.rmtree(directory, ignore_errors=True)
    prompts = ["你好", "Mira is the fisher of the valley."]
    ours = generation.generate(split, tok, prompts, max_new_tokens=5, do_sample=False)
    reference = generation.generate(whole, tok, prompts, max_new_tokens=5, do_sample=False)
    assert [r["generated_ids"] for r in ours] == [r["generated_ids"] for r in reference]


def check_split_weights_load_in_the_dtype_asked():
    """glm-generate's loader at tensor parallel 2 with dtype "bf16": every rank's slices are bf16."""
    import shutil
    import tempfile

    import torch.distributed as dist

    from glm_port.generation.parallel import ModelParallel
    from glm_port.models.chatglm2 import generation
    from glm_port.models.chatglm2.tiny import build_tiny
    from glm_port.models.chatglm2.weights import save_sharded

    whole, tok = build_tiny()
    directory = tempfile.mkdtemp(prefix=f"chatglm2-tp-bf16-{dist.get_rank()}-")
    save_sharded(dict(whole.state_dict()), directory, shards=2, fmt="safetensors")
    whole.config.save_pretrained(directory)
    tok.save_pretrained(directory)
    sdist.setup_dist_util(tensor_parallel_size=2)
    try:
        split, _ = generation.load(directory, dtype="bf16", device="cpu", tensor_parallel=ModelParallel(2, dist.get_rank()))
    finally:
        sdist.reset_dist_util()
        shutil.rmtree(directory, ignore_errors=True)
    dtypes = {name: p.to_local().dtype if hasattr(p, "device_mesh") else p.dtype for name, p in split.named_parameters()}
    assert set(dtypes.values()) == {torch.bfloat16}, dtypes


def check_each_rank_reads_only_its_slices_of_split_weights():
    """From safetensors, glm-generate's loader reads a split weight as a slice of the file (the shared reader's
    ``Tensors.part``), never whole: only replicated tensors (norms, embedding, output layer) are read whole."""
    import shutil
    import tempfile

    import torch.distributed as dist

    from glm_port.generation.parallel import ModelParallel
    from glm_port.models.chatglm2 import generation
    from glm_port.models.chatglm2.tiny import build_tiny
    from glm_port.models.chatglm2.weights import save_sharded
    from glm_port.models.weights_io import Tensors

    whole, tok = build_tiny()
    directory = tempfile.mkdtemp(prefix=f"chatglm2-tp-slices-{dist.get_rank()}-")
    save_sharded(dict(whole.state_dict()), directory, shards=2, fmt="safetensors")
    whole.config.save_pretrained(directory)
    tok.save_pretrained(directory)
    read_whole, getitem = [], Tensors.__getitem__

    def recording(self, name):
        read_whole.append(name)
        return getitem(self, name)

    Tensors.__getitem__ = recording
    sdist.setup_dist_util(tensor_parallel_size=2)
    try:
        generation.load(directory, dtype="fp32", device="cpu", tensor_parallel=ModelParallel(2, dist.get_rank()))
    finally:
        Tensors.__getitem__ = getitem
        sdist.reset_dist_util()
        shutil.rmtree(directory, ignore_errors=True)
    split = ("query_key_value.weight", "self_attention.dense.weight", "dense_h_to_4h.weight", "dense_4h_to_h.weight")
    assert read_whole and not [n for n in read_whole if n.endswith(split)], read_whole


CHECKS = {name: check for name, check in globals().items() if name.startswith("check_")}


@pytest.fixture(scope="module")
def two_ranks(launch):
    return launch(CHECKS)


@pytest.mark.parametrize("name", list(CHECKS))
def test_on_two_ranks(two_ranks, name):
    two_ranks.assert_passed(name)


# ---- tensor parallel 4 on 2 key/value groups: each group on 2 ranks --------------------------------------


def tp4_layers_hold_one_head_and_their_group():
    import torch.distributed as dist

    whole, split = _pair(tp=4)
    rank = dist.get_rank()
    attn = split.transformer.encoder.layers[0].self_attention
    assert (attn.num_heads, attn.num_groups, attn.group_replicas) == (1, 1, 2)
    local = attn.query_key_value.weight.to_local()
    assert local.shape == ((1 + 2 * 1) * 16, 64)
    # THUDM's rows: query head r, then key and value group r // 2 (groups 0, 0, 1, 1 on ranks 0..3).
    q, k, v = whole.transformer.encoder.layers[0].self_attention.query_key_value.weight.split([64, 32, 32])
    group = rank // 2
    expected = torch.cat([q[16 * rank:16 * (rank + 1)], k[16 * group:16 * (group + 1)], v[16 * group:16 * (group + 1)]])
    torch.testing.assert_close(local, expected, rtol=0, atol=0)
    bias = attn.query_key_value.bias.to_local()
    qb, kb, vb = whole.transformer.encoder.layers[0].self_attention.query_key_value.bias.split([64, 32, 32])
    torch.testing.assert_close(bias, torch.cat([qb[16 * rank:16 * (rank + 1)], kb[16 * group:16 * (group + 1)],
                                                vb[16 * group:16 * (group + 1)]]), rtol=0, atol=0)
    # The ranks that share a group mark its rows once: rank 1 and 3 leave them out of the gradient norm.
    assert getattr(attn.query_key_value.weight, "tensor_parallel_duplicate_rows", ()) == (() if rank % 2 == 0 else ((16, 32), (32, 48)))


def tp4_random_init_keeps_the_copies_of_a_group_equal():
    import torch.distributed as dist

    from glm_port.models.chatglm2 import ChatGLM2Config, ChatGLM2ForCausalLM

    torch.manual_seed(0)
    sdist.setup_dist_util(tensor_parallel_size=4)
    try:
        split = ChatGLM2ForCausalLM(ChatGLM2Config(**SMALL))
    finally:
        sdist.reset_dist_util()
    for layer in split.transformer.encoder.layers:
        kv = layer.self_attention.query_key_value.weight.to_local()[16:].contiguous()
        gathered = [torch.empty_like(kv) for _ in range(4)]
        dist.all_gather(gathered, kv)
        assert torch.equal(gathered[0], gathered[1]) and torch.equal(gathered[2], gathered[3])
        assert not torch.equal(gathered[0], gathered[2])  # two different groups
        assert 0.01 < float(kv.std()) < 0.03  # initializer_range 0.02


def tp4_logits_and_padding():
    check_logits_and_padding(tp=4)


def tp4_decoding_with_cache():
    whole, split = _pair(tp=4)
    ids = torch.randint(3, 128, (2, 8), generator=torch.Generator().manual_seed(2))
    kw = dict(max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        assert torch.equal(split.generate(ids, **kw), whole.generate(ids, **kw))
        a, b = whole(ids, use_cache=True), split(ids, use_cache=True)
        assert getattr(b, CACHE).layers[0].keys.shape == (2, 1, 8, 16)  # one key/value group on each rank
        token = a.logits[:, -1:].argmax(-1)
        torch.testing.assert_close(split(token, cache=getattr(b, CACHE)).logits, whole(token, cache=getattr(a, CACHE)).logits, **TOL)


def tp4_gradients_and_clipped_norm():
    """One backward: each rank's gradient is its slice of one process's (a group's rows summed over the
    2 ranks holding it), and Megatron's clip sees one process's norm (the copies counted once)."""
    import torch.distributed as dist

    from glm_port.models.chatglm2.weights import tensor_parallel_slice
    from shim import mpu

    whole, split = _pair(tp=4)
    sdist.setup_dist_util(tensor_parallel_size=4)  # the clip's tensor-parallel group
    try:
        ids = torch.randint(3, 128, (2, 10), generator=torch.Generator().manual_seed(4))
        whole(ids, labels=ids).loss.backward()
        split(ids, labels=ids).loss.backward()
        grads = dict(whole.named_parameters())
        for name, param in split.named_parameters():
            local = param.grad.to_local() if hasattr(param.grad, "to_local") else param.grad
            expected = tensor_parallel_slice(name, grads[name].grad, whole.config, dist.get_rank(), 4)
            torch.testing.assert_close(local, expected, rtol=1e-4, atol=1e-5, msg=name)
        reference = torch.nn.utils.clip_grad_norm_(whole.parameters(), 0.5)
        norm = mpu.clip_grad_norm(list(split.parameters()), 0.5)
        assert norm == pytest.approx(float(reference), rel=1e-5)
    finally:
        sdist.reset_dist_util()


def tp4_glm_generate_loads_split_weights():
    check_glm_generate_loads_split_weights(tp=4)


def tp4_impossible_degrees_are_one_line():
    from glm_port.models.chatglm2 import ChatGLM2Config, ChatGLM2ForCausalLM

    sdist.setup_dist_util(tensor_parallel_size=4)
    try:
        for overrides, message in (
            (dict(num_attention_heads=12, multi_query_group_num=3, kv_channels=8),
             "ChatGLM2: 3 key/value groups do not replicate evenly over 4 tensor-parallel ranks"),
            (dict(num_attention_heads=6, kv_channels=8), "num_attention_heads (6) is not divisible by "
                                                         "tensor_parallel_size (4)"),
        ):
            with pytest.raises(ValueError) as error:
                ChatGLM2ForCausalLM(ChatGLM2Config(**{**SMALL, **overrides}))
            assert message in str(error.value) and "\n" not in str(error.value), error.value
    finally:
        sdist.reset_dist_util()


TP4_CHECKS = {name: check for name, check in globals().items() if name.startswith("tp4_")}


@pytest.fixture(scope="module")
def four_ranks(launch):
    return launch(TP4_CHECKS, world_size=4)


@pytest.mark.parametrize("name", list(TP4_CHECKS))
def test_on_four_ranks_with_two_key_value_groups(four_ranks, name):
    four_ranks.assert_passed(name)
