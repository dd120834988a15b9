"""Weight-only int8 / int4 (shim.nn.quantize_linears) on tiny random models of both families: logits held
to the fp32 model's.

Metric (docs/quantization.md, Quality): ``relative = ||logits_q - logits_fp32|| / ||logits_fp32||``, the
Frobenius norms over every logit of the batch (3 sequences of 12 tokens). Quantized as THUDM's int4/int8
checkpoints are: every linear of the transformer layers; ChatGLM2's ``output_layer`` stays in float
(``skip``), GLM's output is the tied embedding table. Both models at their configs' default init (std 0.02).

Issue 31 asks int8 within 1e-2 and int4 (group 32) within 5e-2. Measured with this metric: int8 0.0070
(ChatGLM2), 0.0054 (GLM); int4 group 32 0.0964 (ChatGLM2), 0.0644 (GLM): **the int4 bound is not met**,
and it is not the scheme's fault: the scheme (min/max, a scale and a float zero per group, round to
nearest) puts a rms error of 7.8% on Gaussian weights, what round-to-nearest on 16 evenly spaced levels
spanning a group of 32 gives (``test_int4_scheme_is_round_to_nearest_over_the_group_range``), and the
best evenly spaced grid per group (an exhaustive search of clipped ranges, the most any scale/zero choice
can do with the CPU kernel's format) reaches 7.0% only, moving these logits to 0.084 and 0.061. In these
tiny models the attention branch carries most of the last hidden state, through two quantized products
(the value rows of ``query_key_value``, then ``dense``): one int4 ``dense`` alone moves ChatGLM2's
logits by 6.7%. So the issue's int4 bound is kept as a strict xfail (it must be revisited if it starts
passing) and the measured error is held against regressions.
"""

import copy

import pytest
import torch

from glm_port import GLMConfig, GLMModel
from glm_port.models.chatglm2.config import TINY, ChatGLM2Config
from glm_port.models.chatglm2.model import ChatGLM2ForCausalLM
from shim.nn import Int4Linear, Int8Linear, quantize_linears
from shim.nn.quantized import quantize_int4, unpack_int4

ISSUE_BOUND = {8: 1e-2, 4: 5e-2}  # issue 31, int4 at group 32
MEASURED_INT4 = {"chatglm2": 0.0964, "glm": 0.0644}  # the norm ratio measured here (module docstring)


def relative(got: torch.Tensor, ref: torch.Tensor) -> float:
    """||got - ref|| / ||ref|| over every element (Frobenius norms), in float64."""
    return ((got.double() - ref.double()).norm() / ref.double().norm()).item()


def _chatglm2():
    torch.manual_seed(0)
    model = ChatGLM2ForCausalLM(ChatGLM2Config(**{**TINY, "padded_vocab_size": 256})).eval()
    ids = torch.randint(3, 256, (3, 12), generator=torch.Generator().manual_seed(1))
    return model, lambda m: m(input_ids=ids).logits


def _glm():
    torch.manual_seed(0)
    config = GLMConfig(vocab_size=256, num_layers=2, hidden_size=64, num_attention_heads=4, max_sequence_length=32)
    model = GLMModel(config).eval()
    ids = torch.randint(0, 256, (3, 12), generator=torch.Generator().manual_seed(1))
    positions = torch.stack([torch.arange(12), torch.zeros(12, dtype=torch.long)]).expand(3, 2, 12)  # 2-D
    sep = torch.tensor([4, 6, 12])
    return model, lambda m: m(ids, positions, sep)[0]


FAMILIES = {"chatglm2": _chatglm2, "glm": _glm}


def _error(family: str, bits: int, dtype=torch.float32) -> float:
    model, logits = FAMILIES[family]()
    with torch.inference_mode():
        model = model.to(dtype)
        ref = logits(model)
        quantized = copy.deepcopy(model)
        swapped = quantize_linears(quantized, bits, group_size=32, skip=["*output_layer"])
        got = logits(quantized)
    kind = Int8Linear if bits == 8 else Int4Linear
    linears = [m for m in quantized.modules() if isinstance(m, kind)]
    assert swapped == len(linears) == 8  # 4 per layer x 2 layers
    return relative(got, ref)


def test_relative_is_the_norm_ratio_not_the_largest_element():
    ref = torch.tensor([[3.0, 4.0]])  # ||ref|| = 5
    assert relative(ref + torch.tensor([[0.0, 1.0]]), ref) == pytest.approx(0.2)  # max-abs ratio would be 0.25
    assert relative(ref, ref) == 0


@pytest.mark.parametrize("family", FAMILIES)
def test_int8_logits_within_the_issue_bound(family):
    error = _error(family, 8)
    assert 0 < error <= ISSUE_BOUND[8], f"{family} int8: relative logit error {error:.4f}"


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.xfail(strict=True, reason="issue 31's int4 bound is not met on these random models (0.0964 ChatGLM2, "
                                       "0.0644 GLM; module docstring): a pass means the bound, the test and "
                                       "docs/quantization.md are to be revisited")
def test_int4_group32_logits_within_the_issue_bound(family):
    error = _error(family, 4)
    assert error <= ISSUE_BOUND[4], f"{family} int4 group 32: relative logit error {error:.4f}"


@pytest.mark.parametrize("family", FAMILIES)
def test_int4_group32_logits_hold_the_measured_error(family):
    error = _error(family, 4)
    assert 0 < error <= MEASURED_INT4[family] * 1.05, f"{family} int4 group 32: relative logit error {error:.4f}"


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("bits", [8, 4])
def test_bf16_quantized_logits_stay_close_to_bf16(family, bits):
    """A bf16 model quantized (the kernels' bf16 paths) against the same bf16 model unquantized."""
    bound = ISSUE_BOUND[8] if bits == 8 else MEASURED_INT4[family] * 1.05
    assert _error(family, bits, torch.bfloat16) < bound + 1e-2  # + bf16's own rounding


def test_int4_scheme_is_round_to_nearest_over_the_group_range():
    """On Gaussian weights, group 32: rms error 7.8% of the weights' (min/max over 15 steps, round to
    nearest: the range of 32 normals is about 4.1 sigma, a step 0.27 sigma, its rounding error / sqrt(12));
    a symmetric absmax / 7 grid, THUDM's, gives 9.7% and truncating instead of rounding 16%."""
    weight = torch.randn(512, 256, generator=torch.Generator().manual_seed(0))
    packed, scale, zero = quantize_int4(weight, 32)
    q = unpack_int4(packed).float().reshape(512, 8, 32)
    dequantized = (q * scale[..., None] + zero[..., None]).reshape(512, 256)
    error = relative(dequantized, weight)
    assert 0.074 < error < 0.080
    groups = weight.reshape(512, 8, 32)
    step = (groups.amax(2) - groups.amin(2)) / 15
    assert ((dequantized - weight).reshape(512, 8, 32).abs() <= step[..., None] / 2 + 1e-6).all()  # half a step


def test_without_skip_the_output_layer_is_quantized_too():
    model, _ = _chatglm2()
    quantized = copy.deepcopy(model)
    assert quantize_linears(quantized, 8) == 9
    assert isinstance(quantized.transformer.output_layer, Int8Linear)
    assert not any(type(m) is torch.nn.Linear for m in quantized.modules())
    assert type(quantized.transformer.embedding.word_embeddings) is torch.nn.Embedding  # embeddings stay
