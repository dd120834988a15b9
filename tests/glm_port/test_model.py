"""GLMModel: upstream's parameter layout, the sep mask, attention == the explicit formula, mems."""

import math

import pytest
import torch

from glm_port import GLMConfig, GLMModel
from glm_port.models.glm.attention import masked_attention, sdpa_attention, visibility_mask

TINY = GLMConfig(vocab_size=64, num_layers=2, hidden_size=32, num_attention_heads=4, max_sequence_length=16,
                 embedding_dropout_prob=0.0, attention_dropout_prob=0.0, output_dropout_prob=0.0)


def make_inputs(batch=2, seq=8, vocab=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (batch, seq), generator=g)
    positions = torch.arange(seq).expand(batch, seq)
    block_positions = torch.randint(0, 4, (batch, seq), generator=g)
    return ids, torch.stack([positions, block_positions], dim=1)


def test_parameter_names_and_shapes_are_upstreams():
    model = GLMModel(TINY)
    h, s = TINY.hidden_size, TINY.max_sequence_length
    expected = {
        "word_embeddings.weight": (64, h),
        "transformer.position_embeddings.weight": (s + 1, h),
        "transformer.block_position_embeddings.weight": (s + 1, h),
        "transformer.final_layernorm.weight": (h,),
        "transformer.final_layernorm.bias": (h,),
    }
    for i in range(TINY.num_layers):
        p = f"transformer.layers.{i}."
        expected.update({
            p + "input_layernorm.weight": (h,), p + "input_layernorm.bias": (h,),
            p + "attention.query_key_value.weight": (3 * h, h), p + "attention.query_key_value.bias": (3 * h,),
            p + "attention.dense.weight": (h, h), p + "attention.dense.bias": (h,),
            p + "post_attention_layernorm.weight": (h,), p + "post_attention_layernorm.bias": (h,),
            p + "mlp.dense_h_to_4h.weight": (4 * h, h), p + "mlp.dense_h_to_4h.bias": (4 * h,),
            p + "mlp.dense_4h_to_h.weight": (h, 4 * h), p + "mlp.dense_4h_to_h.bias": (h,),
        })
    assert {k: tuple(v.shape) for k, v in model.state_dict().items()} == expected


def test_init_follows_upstream():
    model = GLMModel(GLMConfig(num_layers=8, hidden_size=256, num_attention_heads=4, vocab_size=512))
    layer = model.transformer.layers[0]
    assert layer.attention.query_key_value.weight.std().item() == pytest.approx(0.02, rel=0.05)
    # Residual-branch outputs: N(0, 0.02 / sqrt(2 * num_layers)).
    assert layer.mlp.dense_4h_to_h.weight.std().item() == pytest.approx(0.02 / math.sqrt(16), rel=0.05)
    assert not layer.attention.dense.bias.any()


def test_sep_mask_hand_worked():
    # sep = 2: columns 0-1 (Part A) visible to all rows, the rest causal.
    expected = torch.tensor([[1, 1, 0, 0, 0],
                             [1, 1, 0, 0, 0],
                             [1, 1, 1, 0, 0],
                             [1, 1, 1, 1, 0],
                             [1, 1, 1, 1, 1]], dtype=torch.bool)
    mask = visibility_mask(torch.tensor([2, 0]), batch_size=2, query_length=5)
    assert mask.shape == (2, 1, 5, 5)
    assert torch.equal(visibility_mask(torch.tensor([[2], [0]]), batch_size=2, query_length=5), mask)
    assert torch.equal(mask[0, 0], expected)
    assert torch.equal(mask[1, 0], torch.ones(5, 5).tril().bool())  # sep 0: plain causal


def test_sep_mask_scalar_and_memory():
    mask = visibility_mask(torch.tensor(3), batch_size=2, query_length=4, memory_length=2)
    assert mask.shape == (2, 1, 4, 6)
    assert mask[:, :, :, :2].all()  # memory is always visible
    # sep 3 over 4 queries, written out: columns 0-2 (Part A) visible to every row, then causal
    expected = torch.tensor([[1, 1, 1, 0],
                             [1, 1, 1, 0],
                             [1, 1, 1, 0],
                             [1, 1, 1, 1]], dtype=torch.bool)
    assert torch.equal(mask[0, 0, :, 2:], expected) and torch.equal(mask[1, 0, :, 2:], expected)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float64, 1e-12)])
def test_sdpa_equals_explicit_masked_formula(dtype, tol):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(3, 4, 7, 8, generator=g, dtype=dtype) for _ in range(3))
    visible = visibility_mask(torch.tensor([0, 3, 7]), batch_size=3, query_length=7)
    torch.testing.assert_close(sdpa_attention(q, k, v, visible), masked_attention(q, k, v, visible),
                               atol=tol, rtol=tol)


def test_model_sdpa_equals_explicit_formula_with_grads():
    torch.manual_seed(0)
    fast = GLMModel(TINY)
    reference = GLMModel(TINY.replace(attention_impl="explicit"))
    reference.load_state_dict(fast.state_dict())
    ids, positions = make_inputs()
    sep = torch.tensor([3, 5])
    out_fast, out_ref = fast(ids, positions, sep)[0], reference(ids, positions, sep)[0]
    torch.testing.assert_close(out_fast, out_ref, atol=1e-5, rtol=1e-5)
    out_fast.square().mean().backward()
    out_ref.square().mean().backward()
    for (name, a), b in zip(fast.named_parameters(), reference.parameters()):
        torch.testing.assert_close(a.grad, b.grad, atol=1e-5, rtol=1e-4, msg=name)


def _gelu_upstream(t):  # upstream's gelu_impl (OpenAI's tanh approximation)
    return 0.5 * t * (1.0 + torch.tanh(0.7978845608028654 * t * (1.0 + 0.044715 * t * t)))


def reference_forward(sd, config, ids, positions, sep, gelu=_gelu_upstream):
    """GLM's forward written out from the math, straight from a state dict in upstream's layout."""
    h, n = config.hidden_size, config.num_attention_heads
    x = sd["word_embeddings.weight"][ids]
    x = x + sd["transformer.position_embeddings.weight"][positions[:, 0]]
    x = x + sd["transformer.block_position_embeddings.weight"][positions[:, 1]]
    s = ids.size(1)
    mask = torch.ones(s, s, dtype=sd["word_embeddings.weight"].dtype).tril().expand(ids.size(0), s, s).clone()
    for b, sep_b in enumerate(sep.tolist()):
        mask[b, :, :sep_b] = 1
    mask = mask.unsqueeze(1)

    def ln(t, prefix):
        return torch.nn.functional.layer_norm(t, (h,), sd[prefix + ".weight"], sd[prefix + ".bias"], 1e-5)

    for i in range(config.num_layers):
        p = f"transformer.layers.{i}."
        qkv = ln(x, p + "input_layernorm") @ sd[p + "attention.query_key_value.weight"].T
        qkv = qkv + sd[p + "attention.query_key_value.bias"]
        q, k, v = (t.reshape(*t.shape[:2], n, h // n).permute(0, 2, 1, 3) for t in qkv.split(h, dim=-1))
        scores = q @ k.transpose(-1, -2) / math.sqrt(h // n)
        scores = scores * mask - 65504.0 * (1.0 - mask)
        context = (scores.softmax(-1) @ v).permute(0, 2, 1, 3).reshape(x.shape)
        x = x + context @ sd[p + "attention.dense.weight"].T + sd[p + "attention.dense.bias"]
        y = ln(x, p + "post_attention_layernorm") @ sd[p + "mlp.dense_h_to_4h.weight"].T
        y = gelu(y + sd[p + "mlp.dense_h_to_4h.bias"])
        x = x + y @ sd[p + "mlp.dense_4h_to_h.weight"].T + sd[p + "mlp.dense_4h_to_h.bias"]
    x = ln(x, "transformer.final_layernorm")
    return x @ sd["word_embeddings.weight"].T


def test_forward_matches_the_math_written_from_the_state_dict():
    torch.manual_seed(1)
    model = GLMModel(TINY).eval()
    ids, positions = make_inputs(seed=3)
    sep = torch.tensor([2, 6])
    with torch.no_grad():
        logits, = model(ids, positions, sep)
        expected = reference_forward(model.state_dict(), TINY, ids, positions, sep)
    torch.testing.assert_close(logits, expected, atol=1e-5, rtol=1e-5)


def test_full_mask_form_equals_sep_form():
    """A [b, 1, s, s] mask written by hand gives the reference's sep-form logits (Part A bidirectional)."""
    torch.manual_seed(2)
    model = GLMModel(TINY).eval()
    ids, positions = make_inputs()
    sep = torch.tensor([4, 1])
    full = torch.ones(2, 1, 8, 8).tril()
    full[0, 0, :, :4] = 1  # sample 0: Part A is columns 0-3
    full[1, 0, :, :1] = 1  # sample 1: column 0 (already visible to all rows under causal)
    with torch.no_grad():
        expected = reference_forward(model.state_dict(), TINY, ids, positions, sep)
        torch.testing.assert_close(model(ids, positions, full)[0], expected, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(model(ids, positions, sep)[0], expected, atol=1e-5, rtol=1e-5)


def test_mlp_gelu_is_tanh_at_a_scale_that_tells_it_from_erf():
    """Weights of std 1.0 in float64: pre-activations reach |x| ~ 2 where tanh and erf GELU differ by ~1e-3."""
    torch.manual_seed(4)
    model = GLMModel(TINY).double().eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 1.0)
    ids, positions = make_inputs(seed=5)
    sep = torch.tensor([3, 5])
    with torch.no_grad():
        logits, = model(ids, positions, sep)
        state = model.state_dict()
        expected = reference_forward(state, TINY, ids, positions, sep)
        erf = reference_forward(state, TINY, ids, positions, sep, gelu=lambda t: torch.nn.functional.gelu(t))
    assert (expected - erf).abs().max() > 1e-4  # the scale is large enough to see the formula
    torch.testing.assert_close(logits, expected, atol=1e-9, rtol=1e-9)


def test_mems_continue_a_causal_sequence():
    """Running two halves with mems == running the whole sequence (causal mask, sep 0)."""
    torch.manual_seed(3)
    model = GLMModel(TINY).eval()
    ids, positions = make_inputs(batch=1, seq=10)
    sep = torch.tensor([0])
    with torch.no_grad():
        whole = model(ids, positions, sep)[0]
        first, *mems = model(ids[:, :6], positions[:, :, :6], sep, return_memory=True)
        assert len(mems) == TINY.num_layers + 1 and mems[0].shape == (1, 6, TINY.hidden_size)
        second, *_ = model(ids[:, 6:], positions[:, :, 6:], sep, *mems)
    torch.testing.assert_close(torch.cat((first, second), dim=1), whole, atol=1e-5, rtol=1e-5)


def test_max_memory_length_keeps_the_last_positions():
    model = GLMModel(TINY.replace(max_memory_length=4)).eval()
    ids, positions = make_inputs(batch=1, seq=6)
    with torch.no_grad():
        _, *mems = model(ids, positions, torch.tensor([0]))
    assert [m.shape[1] for m in mems] == [4] * (TINY.num_layers + 1)


@pytest.mark.parametrize("chunk, policy", [(1, "full"), (2, "full"), (1, "selective"), (2, "selective")])
def test_checkpointed_activations_give_the_same_grads_with_dropout(chunk, policy):
    config = TINY.replace(embedding_dropout_prob=0.2, attention_dropout_prob=0.2, output_dropout_prob=0.2)
    plain = GLMModel(config)
    checkpointed = GLMModel(
        config.replace(checkpoint_activations=True, checkpoint_num_layers=chunk, checkpoint_policy=policy)
    )
    checkpointed.load_state_dict(plain.state_dict())
    ids, positions = make_inputs()
    grads = []
    for model in (plain, checkpointed):
        torch.manual_seed(7)
        model(ids, positions, torch.tensor([3, 5]))[0].square().mean().backward()
        grads.append([p.grad for p in model.parameters()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def test_hugging_face_prefix_loads_without_renaming():
    source, target = GLMModel(TINY), GLMModel(TINY)
    hf = {"glm." + k: v for k, v in source.state_dict().items()}
    target.load_state_dict(hf)
    for key, value in source.state_dict().items():
        assert torch.equal(target.state_dict()[key], value)


def test_bad_head_count_is_a_clear_error():
    with pytest.raises(ValueError, match="not divisible by 5 attention heads"):
        GLMConfig(hidden_size=32, num_attention_heads=5)
