"""What only a GPU runs, held against the composed formulas and the eager models on that device: the
compiled fused ops, attention with GLM's ``sep`` mask through SDPA's kernels, a bf16 training step against
fp32, cached decoding against the full forward, and the compiled static-cache decode step against eager."""

import pytest
import torch
import torch.nn.functional as F

from glm_port import GLMConfig, GLMModel
from glm_port.models.glm.attention import fused_attention, masked_attention, visibility_mask
from glm_port.training import OptimizerSettings, Precision, build_optimizer, train_step
from shim.ops.bias_act import fused_bias_add_gelu
from shim.ops.bias_dropout import fused_bias_add_dropout
from shim.ops.cross_entropy import sparse_softmax_cross_entropy
from glm_port.models.chatglm2.config import CACHE_KWARG as CACHE  # "cache", or "past_key_values" before transformers 5.2x

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_fused_ops_equal_their_formulas(device, dtype):
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(4, 33, 96, generator=g).to(device, dtype).requires_grad_()
    bias = torch.randn(96, generator=g).to(device, dtype).requires_grad_()
    residual = torch.randn(4, 33, 96, generator=g).to(device, dtype)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=2e-2, atol=2e-2)

    out = fused_bias_add_gelu(x, bias)
    ref = F.gelu(x + bias, approximate="tanh")
    torch.testing.assert_close(out, ref, **tol)
    grads = torch.autograd.grad(out.float().square().sum(), (x, bias))
    expected = torch.autograd.grad(ref.float().square().sum(), (x, bias))
    for a, b in zip(grads, expected):
        torch.testing.assert_close(a.float(), b.float(), rtol=tol["rtol"] * 10, atol=tol["atol"] * 10)

    # dropout off: bias + residual exactly; on: every kept element scaled by 1 / (1 - p), the rest 0
    torch.testing.assert_close(fused_bias_add_dropout(x, bias, 0.0, True, residual=residual), x + bias + residual, **tol)
    dropped = fused_bias_add_dropout(x.detach(), bias.detach(), 0.5, True) - 0
    kept = dropped != 0
    assert 0.3 < kept.float().mean().item() < 0.7
    torch.testing.assert_close(dropped[kept], ((x.detach() + bias.detach()) * 2)[kept], **tol)

    logits = torch.randn(64, 300, generator=g).to(device, dtype).requires_grad_()
    labels = torch.randint(0, 300, (64,), generator=g).to(device)
    loss = sparse_softmax_cross_entropy(logits, labels)
    ref_loss = F.cross_entropy(logits.float(), labels, reduction="none")
    torch.testing.assert_close(loss.float(), ref_loss, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_with_the_sep_mask_equals_upstreams_formula(device, dtype):
    g = torch.Generator(device="cpu").manual_seed(1)
    b, n, s, d = 3, 4, 64, 32
    q, k, v = (torch.randn(b, n, s, d, generator=g).to(device, dtype).requires_grad_() for _ in range(3))
    sep = torch.tensor([5, 40, 64], device=device)
    visible = visibility_mask(sep, b, s)
    out = fused_attention(q, k, v, visible)
    ref = masked_attention(q.float(), k.float(), v.float(), visible)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=3e-2, atol=3e-2)
    torch.testing.assert_close(out.float(), ref, **tol)
    grads = torch.autograd.grad(out.float().sum(), (q, k, v))
    expected = torch.autograd.grad(ref.sum(), (q, k, v))
    for a, e in zip(grads, expected):
        torch.testing.assert_close(a.float(), e.float(), rtol=tol["rtol"] * 3, atol=tol["atol"] * 3)
    assert all(torch.isfinite(t).all() for t in grads)


def _batch(device, batch=4, seq=32, vocab=128, seed=0):
    g = torch.Generator().manual_seed(seed)
    sep = torch.randint(4, seq - 4, (batch,), generator=g)
    columns = torch.arange(seq).expand(batch, seq)
    return {
        "text": torch.randint(0, vocab, (batch, seq), generator=g).to(device),
        "target": torch.randint(0, vocab, (batch, seq), generator=g).to(device),
        "loss_mask": (columns >= sep[:, None]).float().to(device),
        "attention_mask": sep.to(device),
        "position_id": torch.stack([columns, (columns - sep[:, None] + 1).clamp(min=0)], dim=1).to(device),
    }


def test_a_bf16_training_step_tracks_fp32(device):
    config = GLMConfig(vocab_size=128, num_layers=2, hidden_size=64, num_attention_heads=4, max_sequence_length=32,
                       embedding_dropout_prob=0.0, attention_dropout_prob=0.0, output_dropout_prob=0.0)
    losses, updates = {}, {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        torch.manual_seed(0)
        model = GLMModel(config).to(device)
        before = [p.detach().clone() for p in model.parameters()]
        optimizer, scheduler = build_optimizer(model, OptimizerSettings(lr=1e-3, weight_decay=0.01, warmup=0.0,
                                                                         decay_iters=10))
        losses[name] = [train_step(model, [_batch(device, seed=i)], optimizer, scheduler,
                                   Precision(device, dtype)) for i in range(3)]
        updates[name] = torch.cat([(p.detach() - b).flatten() for p, b in zip(model.parameters(), before)])
        assert all(p.dtype == torch.float32 for p in model.parameters())  # fp32 master weights under autocast
    assert losses["bf16"] == pytest.approx(losses["fp32"], rel=2e-2)
    cosine = F.cosine_similarity(updates["bf16"].float(), updates["fp32"].float(), dim=0)
    assert cosine > 0.98, cosine


def test_cached_decoding_gives_the_full_forward(device):
    from glm_port.models.chatglm2 import ChatGLM2Config, ChatGLM2ForCausalLM

    config = ChatGLM2Config(num_layers=2, hidden_size=64, ffn_hidden_size=96, kv_channels=16, num_attention_heads=4,
                            multi_query_group_num=2, padded_vocab_size=128, seq_length=64)
    torch.manual_seed(0)
    model = ChatGLM2ForCausalLM(config).to(device).eval()
    ids = torch.randint(0, 128, (2, 12), generator=torch.Generator().manual_seed(1)).to(device)
    with torch.no_grad():
        full = model(ids, use_cache=False).logits
        first = model(ids[:, :5], use_cache=True)
        chunk = model(ids[:, 5:9], cache=getattr(first, CACHE), use_cache=True)
        last = [model(ids[:, i:i + 1], cache=getattr(chunk, CACHE), use_cache=True).logits for i in range(9, 12)]
    # On a GPU the prompt, the chunk and the single-token steps run different SDPA kernels (and the
    # single-token step folds a group's heads into the query dim): equal up to kernel rounding in fp32.
    torch.testing.assert_close(torch.cat([first.logits, chunk.logits, *last], 1), full, rtol=1e-4, atol=1e-4)


def test_the_compiled_static_decode_step_generates_the_eager_tokens(device):
    from transformers import CompileConfig

    from glm_port.models.chatglm2 import ChatGLM2Config, ChatGLM2ForCausalLM

    config = ChatGLM2Config(num_layers=2, hidden_size=64, ffn_hidden_size=96, kv_channels=16, num_attention_heads=4,
                            multi_query_group_num=2, padded_vocab_size=128, seq_length=64)
    torch.manual_seed(0)
    model = ChatGLM2ForCausalLM(config).to(device).eval()
    ids = torch.randint(3, 128, (2, 7), generator=torch.Generator().manual_seed(4)).to(device)
    ids[1, :2] = 0
    kwargs = dict(attention_mask=(ids != 0).long(), max_new_tokens=6, do_sample=False, eos_token_id=None,
                  pad_token_id=0, cache_implementation="static")
    compile_config = CompileConfig(fullgraph=True, dynamic=False,
                                   mode="reduce-overhead" if device.type == "cuda" else "default")
    compile_config._compile_all_devices = True
    with torch.no_grad():
        eager = model.generate(ids, **kwargs)
        compiled = model.generate(ids, compile_config=compile_config, **kwargs)
        again = model.generate(ids, compile_config=compile_config, **kwargs)  # replayed (CUDA graphs on a GPU)
    assert torch.equal(compiled, eager) and torch.equal(again, eager)
