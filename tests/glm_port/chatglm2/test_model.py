"""ChatGLM2 model: THUDM's parameter names and count, the cache, padding, dtypes, loss; numerics against
transformers' own GlmForCausalLM are in test_convert.py, against THUDM's code in test_reference.py."""

import pytest
import torch
import torch.nn.functional as F

from glm_port.models.chatglm2 import ChatGLM2Config, ChatGLM2ForCausalLM
from glm_port.models.chatglm2.model import num_parameters_expected
from glm_port.models.chatglm2.config import CACHE_KWARG as CACHE  # "cache", or "past_key_values" before transformers 5.2x


def test_parameter_names_are_thudms(model):
    names = set(model.state_dict())
    per_layer = ["input_layernorm.weight", "self_attention.query_key_value.weight",
                 "self_attention.query_key_value.bias", "self_attention.dense.weight",
                 "post_attention_layernorm.weight", "mlp.dense_h_to_4h.weight", "mlp.dense_4h_to_h.weight"]
    expected = {"transformer.embedding.word_embeddings.weight", "transformer.encoder.final_layernorm.weight",
                "transformer.output_layer.weight"}
    expected |= {f"transformer.encoder.layers.{i}.{n}" for i in range(2) for n in per_layer}
    assert names == expected
    qkv = model.state_dict()["transformer.encoder.layers.0.self_attention.query_key_value.weight"]
    assert qkv.shape == ((4 + 2 * 2) * 16, 64)  # H + 2G heads of kv_channels
    assert model.state_dict()["transformer.encoder.layers.0.mlp.dense_h_to_4h.weight"].shape == (2 * 96, 64)


def test_chatglm2_6b_size_matches_thudms_index():
    # THUDM's pytorch_model.bin.index.json for chatglm2-6b gives total_size 12487168064 bytes of fp16:
    # 6243584032 values, of which 32 are rotary_pos_emb.inv_freq.
    config = ChatGLM2Config()
    with torch.device("meta"):
        model = ChatGLM2ForCausalLM(config)
    count = sum(p.numel() for p in model.parameters())
    assert count == num_parameters_expected(config) == 12487168064 // 2 - 32


def test_cache_gives_the_full_forward(model):
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        first = model(ids[:, :5], use_cache=True)
        chunk = model(ids[:, 5:9], cache=getattr(first, CACHE), use_cache=True)  # several tokens after a cache
        last = [model(ids[:, i:i + 1], cache=getattr(chunk, CACHE), use_cache=True).logits for i in range(9, 12)]
    torch.testing.assert_close(torch.cat([first.logits, chunk.logits, *last], 1), full, atol=1e-5, rtol=1e-5)
    # the cache holds the key/value groups only, not one copy per query head
    k = getattr(chunk, CACHE).layers[0].keys
    assert k.shape == (2, 2, 12, 16)


def test_generate_greedy_is_the_no_cache_argmax_loop(model):
    ids = torch.randint(0, 128, (2, 6), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=6, do_sample=False, eos_token_id=None, pad_token_id=0)
        x = ids
        for _ in range(6):
            x = torch.cat([x, model(x, use_cache=False).logits[:, -1:].argmax(-1)], 1)
    assert torch.equal(out, x)


def test_left_padding_leaves_each_row_as_if_alone(model):
    gen = torch.Generator().manual_seed(3)
    short, long = torch.randint(3, 128, (1, 5), generator=gen), torch.randint(3, 128, (1, 9), generator=gen)
    ids = torch.cat([torch.cat([torch.zeros(1, 4, dtype=torch.long), short], 1), long])
    mask = torch.ones_like(ids)
    mask[0, :4] = 0
    with torch.no_grad():
        batch = model(ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
        alone = model(short).logits
        gen_batch = model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, eos_token_id=None)
        gen_alone = model.generate(short, max_new_tokens=4, do_sample=False, eos_token_id=None)
    assert torch.isfinite(batch).all()
    torch.testing.assert_close(batch[0, 4:], alone[0], atol=1e-5, rtol=1e-5)
    assert torch.equal(gen_batch[0, 4:], gen_alone[0])


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_tracks_fp32(make_model, dtype):
    model = make_model(std=0.05)
    ids = torch.randint(0, 128, (2, 10), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        ref = model(ids).logits
        half = model.to(dtype)(ids)
    assert half.logits.dtype == dtype
    assert (half.logits.float() - ref).abs().max() < 0.05 * ref.abs().max()


def test_loss_is_mean_over_counted_positions(model):
    ids = torch.randint(0, 128, (2, 8), generator=torch.Generator().manual_seed(5))
    labels = ids.clone()
    labels[:, :3] = -100
    out = model(ids, labels=labels)
    logp = F.log_softmax(out.logits[:, :-1].float(), -1)
    target, counted = labels[:, 1:], labels[:, 1:] != -100
    token_loss = -logp.gather(-1, target.clamp(min=0)[..., None])[..., 0]
    torch.testing.assert_close(out.loss, (token_loss * counted).sum() / counted.sum())
    out.loss.backward()
    assert model.transformer.output_layer.weight.grad is not None
    model.zero_grad()


def test_too_long_input_is_one_line_error(model):
    with pytest.raises(ValueError, match=r"^ChatGLM2: 65 tokens exceed the model's seq_length \(64\)$"):
        model(torch.zeros(1, 65, dtype=torch.long))


def test_rope_ratio_scales_base_or_positions(make_model):
    ids = torch.arange(1, 11)[None]
    with torch.no_grad():
        plain = make_model()(ids).logits
        base = make_model(rope_ratio=4.0)(ids).logits
        positions = make_model(rope_ratio=4.0, rope_ratio_scales="positions")(ids).logits
    assert not torch.allclose(plain, base) and not torch.allclose(base, positions)
    torch.testing.assert_close(plain[:, 0], base[:, 0])  # position 0 is not rotated either way


def test_a_prefix_config_is_refused_where_no_prefix_runs():
    config = ChatGLM2Config(num_layers=1, hidden_size=32, kv_channels=8, num_attention_heads=4, ffn_hidden_size=32,
                            padded_vocab_size=64, pre_seq_len=16)
    with pytest.raises(ValueError, match="pre_seq_len=16: not supported here .a P-Tuning v2 prefix"):
        config.check_supported()
    config.check_supported(prefix=True)
    assert ChatGLM2ForCausalLM(config).transformer.prefix_encoder.embedding.weight.shape == (16, 1 * 2 * 2 * 8)


def test_without_multi_query_attention_qkv_is_per_head(make_model):
    # THUDM's fused weight without multi-query attention is [q_h; k_h; v_h] per head.
    model = make_model(multi_query_attention=False)
    attn = model.transformer.encoder.layers[0].self_attention
    x = torch.randn(1, 3, attn.num_heads * 3 * attn.head_dim)
    q, k, v = attn.split_qkv(x)
    per_head = x.view(1, 3, attn.num_heads, 3, attn.head_dim)
    assert torch.equal(q.transpose(1, 2), per_head[..., 0, :]) and torch.equal(v.transpose(1, 2), per_head[..., 2, :])
    with torch.no_grad():
        assert torch.isfinite(model(torch.arange(1, 9)[None]).logits).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rmsnorm_statistics_are_fp32_for_half_inputs(dtype):
    """THUDM's RMSNorm squares in fp32: fp16 activations around +-300 (their squares overflow fp16's 65504)
    normalize as in fp32; squared in fp16 they would give inf and an all-zero output."""
    from glm_port.models.chatglm2.model import RMSNorm

    norm = RMSNorm(64)
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 1.5, 64))
    x = (torch.randn(3, 5, 64, generator=torch.Generator().manual_seed(0)) * 100 + 300).clamp(-1000, 1000)
    x[0] *= -1
    expected = norm(x)
    got = norm.to(dtype)(x.to(dtype))
    assert got.dtype == dtype and got.abs().min() > 0
    torch.testing.assert_close(got.float(), expected, rtol=1e-2, atol=1e-2)
