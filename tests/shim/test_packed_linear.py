"""shim.nn.PackedLinear / pack_linears: oneDNN-packed CPU inference linears against F.linear in float64."""

import copy

import pytest
import torch
from torch import nn

from shim.nn import Linear1D, PackedLinear, pack_linears
from shim.nn.packed_linear import packable

pytestmark = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this torch has no oneDNN")


def _reference(linear, x):
    bias = None if linear.bias is None else linear.bias.double()
    return nn.functional.linear(x.double(), linear.weight.double(), bias)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [(1, 1), (3, 1), (2, 7)])  # a decode step at batch 1 and 3, a prefill
def test_packed_matches_the_float64_product(bias, rows):
    torch.manual_seed(0)
    linear = nn.Linear(96, 80, bias=bias)
    x = torch.randn(*rows, 96)
    with torch.inference_mode():
        out = PackedLinear(linear)(x)
    assert out.shape == (*rows, 80) and out.dtype == torch.float32
    torch.testing.assert_close(out.double(), _reference(linear, x), atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not torch.ops.mkldnn._is_mkldnn_bf16_supported(), reason="this CPU has no bf16 for oneDNN")
def test_packed_bf16_matches_within_bf16_rounding():
    torch.manual_seed(0)
    linear = nn.Linear(128, 64).to(torch.bfloat16)
    x = torch.randn(1, 1, 128).to(torch.bfloat16)
    with torch.inference_mode():
        out = PackedLinear(linear)(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), _reference(linear, x), atol=5e-2, rtol=2e-2)


def test_skip_bias_add_is_kept_for_an_unsplit_linear1d():
    torch.manual_seed(0)
    layer = Linear1D(32, 48, parallel="col", skip_bias_add=True)  # no layout: a plain linear
    with torch.no_grad():
        layer.bias.normal_()
    x = torch.randn(2, 3, 32)
    with torch.inference_mode():
        out, bias = PackedLinear(layer)(x)
        want, want_bias = layer(x)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
    assert bias is layer.bias and want_bias is layer.bias


class _Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(16, 64)
        self.down = nn.Linear(64, 16, bias=False)
        self.fp16 = nn.Linear(16, 16).half()  # fp16 on CPU: oneDNN does not pack it here
        self.norm = nn.LayerNorm(16)

    def forward(self, x):
        return self.norm(self.down(torch.relu(self.up(x))) + self.fp16(x.half()).float())


def test_pack_linears_replaces_packable_layers_and_keeps_the_output():
    torch.manual_seed(0)
    net = _Net().eval()
    x = torch.randn(4, 16)
    with torch.inference_mode():
        want = net(x)
        assert pack_linears(net, measure=False) == 2
        got = net(x)
    assert isinstance(net.up, PackedLinear) and isinstance(net.down, PackedLinear)
    assert type(net.fp16) is nn.Linear
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_measured_packing_keeps_the_output_whatever_it_chooses():
    torch.manual_seed(0)
    net = _Net().eval()
    packed = copy.deepcopy(net)
    x = torch.randn(1, 16)
    count = pack_linears(packed, batch_size=1, repeats=2)
    assert 0 <= count <= 2
    assert count == sum(isinstance(m, PackedLinear) for m in packed.modules())
    with torch.inference_mode():
        torch.testing.assert_close(packed(x), net(x), atol=1e-5, rtol=1e-5)


def test_a_packed_model_refuses_gradients_and_saving():
    net = _Net()
    pack_linears(net, measure=False)
    with pytest.raises(RuntimeError, match="inference"):
        net(torch.randn(2, 16, requires_grad=True))
    with pytest.raises(RuntimeError, match="cannot be saved"):
        net.state_dict()


def test_unpackable_weights_are_refused_in_one_line():
    assert not packable(torch.zeros(4, 4, dtype=torch.float16))
    assert not packable(torch.zeros(4, 4, device="meta"))
    with pytest.raises(ValueError, match="cannot pack"):
        PackedLinear(nn.Linear(4, 4).half())


def test_packed_chatglm2_generates_the_same_greedy_tokens():
    from glm_port.models.chatglm2 import ChatGLM2Config, ChatGLM2ForCausalLM

    config = ChatGLM2Config(num_layers=2, hidden_size=64, ffn_hidden_size=96, kv_channels=16, num_attention_heads=4,
                            multi_query_group_num=2, padded_vocab_size=128, seq_length=64)
    torch.manual_seed(0)
    model = ChatGLM2ForCausalLM(config).eval()
    ids = torch.randint(3, 128, (2, 9), generator=torch.Generator().manual_seed(1))
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False, eos_token_id=None,
                  pad_token_id=0)
    with torch.inference_mode():
        want = model.generate(ids, **kwargs)
        logits = model(ids).logits
        assert pack_linears(model, measure=False) == 2 * 4 + 1  # 4 linears per layer + output_layer
        got = model.generate(ids, **kwargs)
        torch.testing.assert_close(model(ids).logits, logits, atol=1e-5, rtol=1e-5)
    assert torch.equal(got, want)
