"""ChatGLM2 with a preallocated cache (transformers' StaticCache, ``glm-generate --static-cache``): the same
tokens as the growing cache, padded rows included, and the decode step compiled (inductor's CPU backend,
the path a GPU replays as a CUDA graph) gives the eager tokens."""

import pytest
import torch
from transformers import CompileConfig

from glm_port.models.chatglm2.model import attention_mask_4d, static_attention_mask

from .conftest import small_model


@pytest.fixture(scope="module")
def model():
    return small_model(std=0.1)


def _left_padded():
    gen = torch.Generator().manual_seed(4)
    ids = torch.randint(3, 128, (3, 7), generator=gen)
    ids[1, :2] = 0
    ids[2, :5] = 0
    return ids, (ids != 0).long()


def test_static_cache_generates_the_dynamic_cache_tokens(model):
    ids, mask = _left_padded()
    kwargs = dict(attention_mask=mask, max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        dynamic = model.generate(ids, **kwargs)
        static = model.generate(ids, cache_implementation="static", **kwargs)
    assert torch.equal(static, dynamic)


def test_static_mask_is_the_dynamic_mask_over_the_written_keys():
    _, mask = _left_padded()
    past, query, buffer = 4, 3, 11
    dynamic = attention_mask_4d(mask, query, past)
    static = static_attention_mask(mask, torch.arange(past, past + query), buffer)
    assert static.shape == (3, 1, query, buffer)
    assert torch.equal(static[..., :past + query], dynamic)
    # rows 0 and 1 hold tokens among the written keys: they never look past them (row 2's first query is a
    # padding one and sees every key, as in the growing cache's mask)
    assert not static[:2, ..., past + query:].any()
    assert static[2, 0, 0].all() and not static[2, 0, 1:, past + query:].any()


def test_static_mask_takes_generates_4d_mask_and_keeps_padding_rows_finite():
    given = torch.zeros(1, 1, 2, 5, dtype=torch.bool)
    given[0, 0, 1, :2] = True  # row 0: every key masked (a padding query)
    mask = static_attention_mask(given, torch.arange(2), 5)
    assert mask[0, 0, 0].all() and torch.equal(mask[0, 0, 1], given[0, 0, 1])
    additive = torch.where(given, 0.0, torch.finfo(torch.float32).min)
    assert torch.equal(static_attention_mask(additive, torch.arange(2), 5), mask)


def test_compiled_static_decode_step_generates_the_eager_tokens(model):
    ids, mask = _left_padded()
    kwargs = dict(attention_mask=mask, max_new_tokens=4, do_sample=False, eos_token_id=None, pad_token_id=0,
                  cache_implementation="static")
    config = CompileConfig(fullgraph=True, dynamic=False)
    config._compile_all_devices = True  # transformers compiles on CUDA only unless told: here inductor's CPU backend
    with torch.no_grad():
        eager = model.generate(ids, **kwargs)
        compiled = model.generate(ids, compile_config=config, **kwargs)
    assert getattr(model, "_compiled_call", None) is not None  # the decode steps did go through torch.compile
    assert torch.equal(compiled, eager)
