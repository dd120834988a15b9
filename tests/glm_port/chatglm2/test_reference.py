"""Our ChatGLM2 against THUDM's own modeling_chatglm.py on the same small random weights.

THUDM's code is not part of this project: point CHATGLM2_CODE at a directory holding a copy of
chatglm2-6b's configuration_chatglm.py and modeling_chatglm.py (public on GitHub; fetch it, never commit
it). It runs under transformers 5.x for the forward pass (its generate helpers do not).
"""

import importlib
import os
import sys
import types
from pathlib import Path

import pytest
import torch
from glm_port.models.chatglm2.config import CACHE_KWARG as CACHE  # "cache", or "past_key_values" before transformers 5.2x

CODE = os.environ.get("CHATGLM2_CODE")
pytestmark = pytest.mark.skipif(
    not CODE or not (Path(CODE) / "modeling_chatglm.py").is_file(),
    reason="set CHATGLM2_CODE=/dir/with/THUDM's modeling_chatglm.py and configuration_chatglm.py",
)


def _thudm():
    name = "_thudm_chatglm2_reference"
    if name not in sys.modules:
        package = types.ModuleType(name)  # a package around the directory, for its relative import
        package.__path__ = [CODE]
        sys.modules[name] = package
    return (importlib.import_module(f"{name}.configuration_chatglm"),
            importlib.import_module(f"{name}.modeling_chatglm"))


def _pair(make_model, **overrides):
    ours = make_model(**overrides)
    cm, mm = _thudm()
    fields = {k: getattr(ours.config, k) for k in (
        "num_layers", "padded_vocab_size", "hidden_size", "ffn_hidden_size", "kv_channels", "num_attention_heads",
        "seq_length", "layernorm_epsilon", "add_qkv_bias", "multi_query_attention", "multi_query_group_num")}
    config = cm.ChatGLMConfig(**fields, original_rope=True, torch_dtype=torch.float32)
    config.max_length, config.use_cache = ours.config.seq_length, True  # attributes transformers 5 no longer sets
    theirs = mm.ChatGLMForConditionalGeneration(config, empty_init=False).eval()
    missing, unexpected = theirs.load_state_dict(ours.state_dict(), strict=False)
    assert unexpected == [] and missing == ["transformer.rotary_pos_emb.inv_freq"]
    return ours, theirs


@pytest.mark.parametrize("mqa", [True, False])
def test_logits_match_thudm(make_model, mqa):
    ours, theirs = _pair(make_model, multi_query_attention=mqa)
    ids = torch.randint(0, 128, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(ours(ids).logits, theirs(ids).logits, atol=1e-5, rtol=1e-5)


def test_left_padded_batch_matches_thudm(make_model):
    ours, theirs = _pair(make_model)
    ids = torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0
    ids[0, :5] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # THUDM's tokenizer pads position_ids with 0 on the left
    with torch.no_grad():
        a = ours(ids, attention_mask=mask, position_ids=positions).logits
        b = theirs(ids, attention_mask=mask, position_ids=positions).logits
    torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)  # padding rows too: both let them see every key


def test_decoding_with_cache_matches_thudm(make_model):
    ours, theirs = _pair(make_model)
    ids = torch.randint(0, 128, (1, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        a, b = ours(ids, use_cache=True), theirs(ids, use_cache=True)
        cache, past = getattr(a, CACHE), b.past_key_values
        for step in range(5):
            token = a.logits[:, -1:].argmax(-1)
            assert torch.equal(token, b.logits[:, -1:].argmax(-1))
            position = torch.tensor([[ids.shape[1] + step]])
            a = ours(token, position_ids=position, cache=cache, use_cache=True)
            b = theirs(token, position_ids=position, past_key_values=past, use_cache=True)
            cache, past = getattr(a, CACHE), b.past_key_values
            torch.testing.assert_close(a.logits, b.logits, atol=1e-5, rtol=1e-5)
    assert past[0][0].shape == (12, 1, 2, 16)  # THUDM's cache: [s, b, groups, d]; ours is the same data
    torch.testing.assert_close(cache.layers[0].keys.permute(2, 0, 1, 3), past[0][0])


@pytest.mark.parametrize("projection", [False, True])
def test_ptuning_prefix_matches_thudm(make_model, projection):
    """P-Tuning v2: THUDM's model built with pre_seq_len (and prefix_projection), its prefix encoder given the
    weights ours holds: the same logits, left padding included, and the same cached decoding (eval: no dropout)."""
    ours = make_model(pre_seq_len=4, prefix_projection=projection)
    cm, mm = _thudm()
    fields = {k: getattr(ours.config, k) for k in (
        "num_layers", "padded_vocab_size", "hidden_size", "ffn_hidden_size", "kv_channels", "num_attention_heads",
        "seq_length", "layernorm_epsilon", "add_qkv_bias", "multi_query_attention", "multi_query_group_num",
        "pre_seq_len", "prefix_projection")}
    config = cm.ChatGLMConfig(**fields, original_rope=True, torch_dtype=torch.float32)
    config.max_length, config.use_cache = ours.config.seq_length, True
    theirs = mm.ChatGLMForConditionalGeneration(config, empty_init=False).eval()
    missing, unexpected = theirs.load_state_dict(ours.state_dict(), strict=False)
    assert unexpected == [] and missing == ["transformer.rotary_pos_emb.inv_freq"]
    ids = torch.randint(3, 128, (2, 9), generator=torch.Generator().manual_seed(3))
    mask = torch.ones_like(ids)
    mask[0, :3] = 0
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        a = ours(ids, attention_mask=mask, position_ids=positions).logits
        b = theirs(ids, attention_mask=mask, position_ids=positions).logits
        torch.testing.assert_close(a[1], b[1], atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(a[0, 3:], b[0, 3:], atol=1e-5, rtol=1e-5)  # the real tokens of the padded row
        a, b = ours(ids[1:], use_cache=True), theirs(ids[1:], use_cache=True)
        cache, past = getattr(a, CACHE), b.past_key_values
        for step in range(4):
            token = a.logits[:, -1:].argmax(-1)
            position = torch.tensor([[ids.shape[1] + step]])
            a = ours(token, position_ids=position, cache=cache, use_cache=True)
            b = theirs(token, position_ids=position, past_key_values=past, use_cache=True)
            cache, past = getattr(a, CACHE), b.past_key_values
            torch.testing.assert_close(a.logits, b.logits, atol=1e-5, rtol=1e-5)
    assert past[0][0].shape[0] == 4 + 9 + 4  # THUDM's cache holds the prefix too
