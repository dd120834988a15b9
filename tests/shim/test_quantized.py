"""shim.nn.quantized: weight-only int8/int4 layers against float64 products of their own dequantized
weights, the saved layout, bad shapes, and THUDM's int4/int8 layout (hand-computed bytes; with
THUDM_QUANT_CODE=/path/to/THUDM's quantization.py, against what that code computes)."""

import copy
import importlib.util
import os
import shutil

import pytest
import torch
from torch import nn

from shim.nn import Int4Linear, Int8Linear, Linear1D, pack_quantized, quantize_linears
from shim.nn.quantized import (
    dequantize_thudm,
    from_thudm,
    pack_int4,
    quantize_int4,
    quantize_int8,
    quantize_thudm,
    unpack_int4,
)


def _reference(layer, x):
    """x @ W.T + b in float64, W the layer's own dequantized weight (taken before packing)."""
    weight = layer.dequantize(torch.float64)
    bias = None if layer.bias is None else layer.bias.double()
    return nn.functional.linear(x.double(), weight, bias)


# ------------------------------------------------------------------------------------------- int8


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("shape", [(1, 1), (8, 1), (2, 7)])  # decode at batch 1 and 8, a prefill
@pytest.mark.parametrize("in_features", [64, 40])  # 40: bf16's kernel would crash, the fallback runs
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8_matches_its_dequantized_weight(bias, shape, in_features, dtype):
    torch.manual_seed(0)
    layer = Int8Linear.from_linear(nn.Linear(in_features, 24, bias=bias).to(dtype))
    x = torch.randn(*shape, in_features).to(dtype)
    with torch.inference_mode():
        out = layer(x)
    assert out.shape == (*shape, 24) and out.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.double(), _reference(layer, x), atol=tol, rtol=tol)


def test_int8_quantization_is_symmetric_per_row():
    weight = torch.tensor([[0.0, 1.27, -0.635], [2.54, -2.54, 0.02], [0.0, 0.0, 0.0]])
    q, scale = quantize_int8(weight)
    torch.testing.assert_close(scale, torch.tensor([0.01, 0.02, 1.0]))  # an all-zero row keeps scale 1
    assert q.tolist() == [[0, 127, -64], [127, -127, 1], [0, 0, 0]]  # -63.5 rounds to even


def test_int8_compute_dtype_casts_around_the_kernel():
    torch.manual_seed(0)
    layer = Int8Linear.from_linear(nn.Linear(64, 32)).pack(torch.bfloat16)
    x = torch.randn(3, 64)
    with torch.inference_mode():
        out = layer(x)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out.double(), _reference(layer, x), atol=3e-2, rtol=2e-2)


# ------------------------------------------------------------------------------------------- int4


@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("out_features", [48, 40])  # 40: not a multiple of the CPU kernel's 16 rows
@pytest.mark.parametrize("shape", [(1, 1), (8, 1), (2, 7)])
def test_int4_packed_matches_its_dequantized_weight(group_size, out_features, shape):
    torch.manual_seed(0)
    layer = Int4Linear.from_linear(nn.Linear(256, out_features), group_size)
    x = torch.randn(*shape, 256)
    ref = _reference(layer, x)
    with torch.inference_mode():
        unpacked = layer(x)  # dequantizes per call
        layer.pack()
        assert layer.packed and layer.weight is None
        out = layer(x)
    assert out.shape == (*shape, out_features)
    torch.testing.assert_close(unpacked.double(), ref, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.double(), ref, atol=1e-4, rtol=1e-4)


def test_int4_bf16_packed_matches_within_bf16_rounding():
    torch.manual_seed(0)
    layer = Int4Linear.from_linear(nn.Linear(128, 64).to(torch.bfloat16), 32)
    x = torch.randn(2, 3, 128).to(torch.bfloat16)
    ref = _reference(layer, x)
    with torch.inference_mode():
        out = layer.pack()(x)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.double(), ref, atol=5e-2, rtol=2e-2)


def test_int4_quantization_maps_each_group_min_max_onto_the_16_levels():
    row = torch.linspace(-1.0, 2.0, 32)  # one group: min -1, max 2, scale 0.2, zero -1 + 8 * 0.2 = 0.6
    packed, scale, zero = quantize_int4(row[None], 32)
    torch.testing.assert_close(scale, torch.tensor([[0.2]]))
    torch.testing.assert_close(zero, torch.tensor([[0.6]]))
    q = unpack_int4(packed)
    assert q[0, 0] == -8 and q[0, -1] == 7  # the ends map onto the ends
    dequantized = q.float() * scale + zero
    assert (dequantized - row).abs().max() <= 0.1 + 1e-6  # within half a step


def test_skip_bias_add_is_kept():
    torch.manual_seed(0)
    linear = Linear1D(64, 32, parallel="row", skip_bias_add=True)  # no layout: a plain linear
    with torch.no_grad():
        linear.bias.normal_()
    x = torch.randn(2, 64)
    for layer in (Int8Linear.from_linear(linear), Int4Linear.from_linear(linear, 32).pack()):
        with torch.inference_mode():
            out, bias = layer(x)
        torch.testing.assert_close(bias, linear.bias.detach())
        torch.testing.assert_close(out, linear(x)[0].detach(), atol=0.2, rtol=0.1)


@pytest.mark.parametrize("group_size", [16, 48, 256])
def test_a_group_size_outside_32_64_128_is_a_one_line_error(group_size):
    with pytest.raises(ValueError, match=r"^int4 group size \d+ is not one of 32, 64, 128$"):
        Int4Linear(256, 16, group_size=group_size)


def test_a_group_size_that_does_not_divide_the_row_is_an_error_before_anything_changes():
    model = nn.Sequential(nn.Linear(64, 96), nn.Linear(96, 64))
    before = copy.deepcopy(model)
    with pytest.raises(ValueError, match=r"^1: int4 group size 64 does not divide the row of 96 input features$"):
        quantize_linears(model, 4, group_size=64)
    assert all(type(m) is nn.Linear for m in model)  # nothing replaced
    torch.testing.assert_close(model[0].weight, before[0].weight)


def test_unknown_bits_is_an_error():
    with pytest.raises(ValueError, match="bits must be 4 or 8"):
        quantize_linears(nn.Linear(64, 64), 3)


def test_quantize_linears_keeps_what_it_cannot_or_is_told_not_to_swap():
    class Scaled(nn.Linear):  # a subclass that computes more than x @ W.T + b
        def forward(self, x):
            return 2 * super().forward(x)

    model = nn.ModuleDict({"emb": nn.Embedding(10, 64), "norm": nn.LayerNorm(64), "a": nn.Linear(64, 64),
                           "lm_head": nn.Linear(64, 10), "odd": Scaled(64, 64)})
    assert quantize_linears(model, 8, skip="lm_head") == 1
    assert isinstance(model["a"], Int8Linear)
    assert [type(model[k]) for k in ("emb", "norm", "lm_head", "odd")] == [nn.Embedding, nn.LayerNorm, nn.Linear,
                                                                           Scaled]


def test_inference_only():
    layer = Int8Linear.from_linear(nn.Linear(16, 16))
    with pytest.raises(RuntimeError, match="inference"):
        layer(torch.randn(1, 16, requires_grad=True))


# ------------------------------------------------------------------------------ saving and loading


@pytest.mark.parametrize("bits", [8, 4])
def test_state_dict_round_trip_loads_without_requantizing(bits, tmp_path):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 48), nn.GELU(), nn.Linear(48 if bits == 8 else 64, 32))
    if bits == 4:
        model[1] = nn.Identity()
        model[0] = nn.Linear(64, 64)
    quantize_linears(model, bits, group_size=32, pack=False)
    state = model.state_dict()
    names = {k: (tuple(v.shape), v.dtype) for k, v in state.items()}
    if bits == 8:
        assert names["0.weight"] == ((48, 64), torch.int8) and names["0.weight_scale"] == ((48,), torch.float32)
    else:
        assert names["0.weight"] == ((64, 32), torch.int8)
        assert names["0.weight_scale"] == names["0.weight_zero"] == ((64, 2), torch.float32)
    torch.save(state, tmp_path / "q.pt")

    fresh = copy.deepcopy(model)  # the same layers, then overwritten with other values
    for module in fresh.modules():
        for name, buffer in module.named_buffers(recurse=False):
            buffer.zero_() if buffer.dtype == torch.int8 else buffer.fill_(3.0)
    fresh.load_state_dict(torch.load(tmp_path / "q.pt"))
    assert pack_quantized(fresh) == 2
    x = torch.randn(2, 64)
    with torch.inference_mode():
        torch.testing.assert_close(fresh(x), model(x), atol=1e-4, rtol=1e-4)


def test_a_packed_int4_layer_refuses_state_dict_in_one_line():
    model = nn.Sequential(nn.Linear(64, 32))
    quantize_linears(model, 4, group_size=32)  # packed
    with pytest.raises(RuntimeError, match=r"^0: the int4 weight is packed .* pack=False"):
        model.state_dict()


def test_scales_of_the_wrong_shape_are_refused():
    model = nn.Sequential(nn.Linear(64, 32))
    quantize_linears(model, 4, group_size=32, pack=False)
    state = model.state_dict()
    state["0.weight_scale"] = state["0.weight_scale"][:, :1]
    with pytest.raises(ValueError, match=r"0\.weight_scale: shape \(32, 1\) does not match"):
        model.load_state_dict(state)
    state = model.state_dict()
    del state["0.weight_scale"]
    with pytest.raises(RuntimeError, match="Missing key.*weight_scale"):
        model.load_state_dict(state)


# ----------------------------------------------------------------------------------- THUDM's layout


def test_nibble_order_hand_computed():
    # THUDM packs column 2j in the high nibble and 2j + 1 in the low one, two's complement.
    assert pack_int4(torch.tensor([[1, -2]])).view(torch.uint8).tolist() == [[0x1E]]
    assert pack_int4(torch.tensor([[-8, 7, 0, -1]])).view(torch.uint8).tolist() == [[0x87, 0x0F]]
    byte = torch.tensor([[0xF0 - 256, 0x7F, 0x08]], dtype=torch.int8)  # 0xF0, 0x7F, 0x08
    assert unpack_int4(byte).tolist() == [[-1, 0, 7, -1, 0, -8]]


def test_quantize_thudm_hand_computed():
    weight = torch.tensor([[0.7, -0.35, 0.1, 0.0], [-1.4, 0.2, 0.0, 0.6]])
    packed, scale = quantize_thudm(weight, 4)  # absmax / 7: 0.1 and 0.2
    torch.testing.assert_close(scale, torch.tensor([0.1, 0.2]))
    # row 0: 7, -3.5 -> -4 (half to even), 1, 0; row 1: -7, 1, 0, 3
    assert packed.view(torch.uint8).tolist() == [[0x7C, 0x10], [0x91, 0x03]]
    torch.testing.assert_close(dequantize_thudm(packed, scale, 4),
                               torch.tensor([[0.7, -0.4, 0.1, 0.0], [-1.4, 0.2, 0.0, 0.6]]))
    q8, scale8 = quantize_thudm(weight, 8)
    torch.testing.assert_close(scale8, torch.tensor([0.7, 1.4]) / 127)
    assert q8[0].tolist() == [127, -64, 18, 0]  # 0.35 / (0.7 / 127) = 63.5 -> 64


@pytest.mark.parametrize("bits", [4, 8])
def test_from_thudm_keeps_the_bytes_and_computes_thudm_dequantized_product(bits):
    torch.manual_seed(0)
    weight = torch.randn(48, 256)
    q, scale = quantize_thudm(weight.half(), bits)  # as the published checkpoints: float16 scales
    bias = torch.randn(48)
    layer = from_thudm(q, scale, bits, bias, in_features=256, dtype=torch.float32)
    assert isinstance(layer, Int4Linear if bits == 4 else Int8Linear)
    assert torch.equal(layer.weight, q)  # no conversion of the bytes
    thudm = dequantize_thudm(q, scale, bits)
    torch.testing.assert_close(layer.dequantize(), thudm, atol=0, rtol=0)
    x = torch.randn(3, 256)
    with torch.inference_mode():
        out = layer.pack()(x)
    torch.testing.assert_close(out, x @ thudm.T + bias, atol=1e-4, rtol=1e-4)


def test_from_thudm_refuses_missing_or_misshapen_scales():
    q, scale = quantize_thudm(torch.randn(8, 64), 4)
    with pytest.raises(ValueError, match=r"weight_scale of shape \(4,\) does not match a weight of 8 rows"):
        from_thudm(q, scale[:4], 4)
    with pytest.raises(ValueError, match="holds 64 input features, not 128"):
        from_thudm(q, scale, 4, in_features=128, group_size=32)
    with pytest.raises(ValueError, match="int4 group size 128 does not divide the row of 64"):
        from_thudm(q, scale, 4)
    with pytest.raises(ValueError, match="must be a 2-D int8 tensor"):
        from_thudm(q.float(), scale, 4)


THUDM_CODE = os.environ.get("THUDM_QUANT_CODE")


@pytest.fixture(scope="module")
def thudm(tmp_path_factory):
    """THUDM's quantization.py, copied into a scratch directory (its CPU kernel is compiled beside it)."""
    if not THUDM_CODE:
        pytest.skip("THUDM_QUANT_CODE=/path/to/THUDM's quantization.py (chatglm2-6b-int4) not set")
    directory = tmp_path_factory.mktemp("thudm")
    shutil.copyfile(THUDM_CODE, directory / "quantization.py")
    spec = importlib.util.spec_from_file_location("_thudm_quantization", directory / "quantization.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not module.cpu_kernels.load:
        pytest.skip("THUDM's CPU kernel did not compile here (it needs gcc)")
    return module


@pytest.mark.parametrize("bits", [4, 8])
def test_against_thudm_code(thudm, bits):
    """Bytes packed as THUDM's CPU kernel packs them; weights and a layer's output as THUDM's CPU path
    (``extract_weight_to_float``, ``QuantizedLinear.forward``) computes them from the same tensors."""
    import ctypes

    torch.manual_seed(0)
    weight = torch.randn(48, 256).half()
    q, scale = quantize_thudm(weight, bits)
    if bits == 4:
        unpacked = unpack_int4(q)
        theirs = torch.empty_like(q)
        thudm.cpu_kernels.int4WeightCompression(ctypes.c_void_p(unpacked.data_ptr()), ctypes.c_void_p(theirs.data_ptr()),
                                                ctypes.c_int32(q.shape[0]), ctypes.c_int32(q.shape[1]))
        assert torch.equal(theirs, q)
    scale32 = scale.float()  # THUDM's CPU path runs the model in float32
    their_weight = thudm.extract_weight_to_float(q, scale32, bits)
    torch.testing.assert_close(dequantize_thudm(q, scale, bits), their_weight, atol=0, rtol=0)
    layer = from_thudm(q, scale, bits, torch.randn(48), dtype=torch.float32)
    torch.testing.assert_close(layer.dequantize(), their_weight, atol=0, rtol=0)

    theirs = thudm.QuantizedLinear(bits, torch.empty(48, 256), bias=layer.bias.detach(), device="cpu",
                                   dtype=torch.float32, empty_init=True)
    theirs.weight = nn.Parameter(q, requires_grad=False)
    theirs.weight_scale = nn.Parameter(scale32, requires_grad=False)
    x = torch.randn(2, 5, 256)
    with torch.inference_mode():
        torch.testing.assert_close(layer.pack()(x), theirs(x), atol=1e-4, rtol=1e-4)
