"""Weight-only int8 and int4 linear layers on the kernels PyTorch ships, and THUDM's quantized layout.

Activations stay in floating point (fp32, bf16, fp16); only the weights are stored in fewer bits and
dequantized inside the product:

- :class:`Int8Linear`: symmetric int8 weights, one scale per output row. On CPU the product is
  ``torch.ops.aten._weight_int8pack_mm`` (int8 weight read as is, scaled per row).
- :class:`Int4Linear`: int4 weights with a scale and a zero point per group of ``group_size``
  (32, 64 or 128) input columns (min/max, asymmetric). On CPU the product is
  ``torch.ops.aten._weight_int4pack_mm_for_cpu`` on the weight reordered once by
  ``_convert_weight_to_int4pack_for_cpu``; on CUDA ``_weight_int4pack_mm`` (tinygemm, bf16) on
  ``_convert_weight_to_int4pack``'s layout. Anywhere else, and for a layer not packed, the weight is
  dequantized for each call (correct, slow).

:func:`quantize_linears` swaps a model's ``nn.Linear`` layers (and unsplit ``shim.nn.Linear1D``) for
these, in place, as :func:`shim.nn.pack_linears` does for oneDNN's packed layout; embeddings and norms
are not linears and stay as they are; ``skip`` keeps named layers (the output layer, say) in full
precision.

Saved layout (``state_dict``; docs/quantization.md has it with the formulas):

=========  =================================================================================
int8       ``weight`` int8 ``[out, in]``; ``weight_scale`` ``[out]`` (float);
           ``w[o, i] = weight[o, i] * weight_scale[o]``
int4       ``weight`` int8 ``[out, in / 2]``: two signed 4-bit values a byte, column ``2j`` in the
           high nibble and ``2j + 1`` in the low one (THUDM's order); ``weight_scale`` and
           ``weight_zero`` ``[out, in / group_size]`` (float);
           ``w[o, i] = q[o, i] * weight_scale[o, i // g] + weight_zero[o, i // g]``, q in -8..7
=========  =================================================================================

plus ``bias`` where the layer has one. THUDM's int8 layout is this int8 layout; THUDM's int4 layout
(one scale per row, no zero point) is this int4 layout's bytes with the scale repeated over the groups
and zeros of zero, so :func:`from_thudm` loads it without dequantizing.

The int4 CPU and CUDA kernels read the weight in a layout of their own that depends on the machine
(AVX-512 or AVX2 blocking on CPU, tinygemm's tiles on CUDA): :meth:`Int4Linear.pack` makes it once and
drops the portable bytes, after which the layer serves inference only and refuses ``state_dict``. To
save, quantize with ``pack=False`` (the layer then dequantizes per call), save, and call
:func:`pack_quantized` after loading.
"""

from __future__ import annotations

from fnmatch import fnmatchcase

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "GROUP_SIZES",
    "Int4Linear",
    "Int8Linear",
    "dequantize_thudm",
    "from_thudm",
    "pack_int4",
    "pack_quantized",
    "quantize_int4",
    "quantize_int8",
    "quantize_linears",
    "quantize_thudm",
    "unpack_int4",
]

GROUP_SIZES = (32, 64, 128)
_CPU_ROW_MULTIPLE = 16  # _convert_weight_to_int4pack_for_cpu wants N divisible by 16; rows are padded to it
_CUDA_INNER_K_TILES = 8


def _check_group(in_features: int, group_size: int) -> None:
    if group_size not in GROUP_SIZES:
        raise ValueError(f"int4 group size {group_size} is not one of {', '.join(map(str, GROUP_SIZES))}")
    if in_features % group_size:
        raise ValueError(f"int4 group size {group_size} does not divide the row of {in_features} input features")


# ---------------------------------------------------------------------------------------------------------
# nibbles and quantization (plain torch; the formulas of the module docstring)


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """``[out, in]`` integers in -8..7 -> int8 ``[out, in / 2]``: column 2j in the high nibble, 2j + 1 in the low."""
    if q.dim() != 2 or q.shape[1] % 2:
        raise ValueError(f"pack_int4: need a 2-D tensor with an even number of columns, got {tuple(q.shape)}")
    q = q.to(torch.int16)
    if q.numel() and not q.is_meta and (q.min() < -8 or q.max() > 7):
        raise ValueError("pack_int4: values must lie in -8..7")
    high, low = q[:, 0::2] & 0xF, q[:, 1::2] & 0xF
    return ((high << 4) | low).to(torch.uint8).view(torch.int8)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """int8 ``[out, in / 2]`` (:func:`pack_int4`'s order) -> int8 ``[out, in]`` in -8..7, sign-extended."""
    if packed.dtype not in (torch.int8, torch.uint8) or packed.dim() != 2:
        raise ValueError(f"unpack_int4: need a 2-D int8 tensor, got {packed.dtype} {tuple(packed.shape)}")
    byte = packed.view(torch.int8).to(torch.int16)
    high = byte >> 4  # arithmetic shift: the sign comes with it
    low = ((byte & 0xF) ^ 8) - 8  # sign-extend the low nibble
    return torch.stack([high, low], dim=-1).reshape(packed.shape[0], -1).to(torch.int8)


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8: ``(q int8 [out, in], scale float32 [out])``, scale = absmax / 127."""
    w = weight.detach().float()
    scale = w.abs().amax(dim=1) / 127
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row stays zero
    q = torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8)
    return q, scale


def quantize_int4(weight: torch.Tensor, group_size: int = 128) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Group-wise min/max int4: ``(packed int8 [out, in/2], scale [out, G], zero [out, G])`` in float32.

    Each group of ``group_size`` columns maps its [min, max] onto -8..7:
    ``scale = (max - min) / 15``, ``zero = min + 8 * scale``, ``q = round((w - min) / scale) - 8``.
    """
    out_features, in_features = weight.shape
    _check_group(in_features, group_size)
    w = weight.detach().float().reshape(out_features, in_features // group_size, group_size)
    low, high = w.amin(dim=2), w.amax(dim=2)
    scale = ((high - low) / 15).clamp_(min=1e-8)
    q = torch.round((w - low[..., None]) / scale[..., None]).clamp_(0, 15) - 8
    zero = low + 8 * scale
    return pack_int4(q.reshape(out_features, in_features)), scale, zero


def quantize_thudm(weight: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """THUDM's recipe (``quantization_bit`` 4 or 8): ``(weight int8, weight_scale)`` as its checkpoints hold them.

    ``weight_scale = absmax(row) / (2**(bits-1) - 1)`` in the weight's dtype, ``q = round(w / scale)``;
    for 4 bits two values a byte (:func:`pack_int4`), ``[out, in / 2]``.
    """
    if bits not in (4, 8):
        raise ValueError(f"quantization bits must be 4 or 8, got {bits}")
    w = weight.detach()
    scale = w.abs().amax(dim=-1) / (2 ** (bits - 1) - 1)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round(w / safe[:, None]).clamp_(-(2 ** (bits - 1)), 2 ** (bits - 1) - 1).to(torch.int8)
    return (pack_int4(q) if bits == 4 else q), scale


def dequantize_thudm(weight: torch.Tensor, weight_scale: torch.Tensor, bits: int) -> torch.Tensor:
    """THUDM's layout -> float32 ``[out, in]``: ``q * weight_scale[row]`` (q unpacked for 4 bits)."""
    _check_thudm(weight, weight_scale, bits)
    q = unpack_int4(weight) if bits == 4 else weight
    return q.float() * weight_scale.float()[:, None]


def _check_thudm(weight: torch.Tensor, weight_scale: torch.Tensor, bits: int) -> None:
    if bits not in (4, 8):
        raise ValueError(f"quantization_bit must be 4 or 8, got {bits}")
    if weight.dtype != torch.int8 or weight.dim() != 2:
        raise ValueError(f"a {bits}-bit weight must be a 2-D int8 tensor, got {weight.dtype} {tuple(weight.shape)}")
    if weight_scale.dim() != 1 or weight_scale.shape[0] != weight.shape[0]:
        raise ValueError(f"weight_scale of shape {tuple(weight_scale.shape)} does not match a weight of "
                         f"{weight.shape[0]} rows (want [{weight.shape[0]}])")


# ---------------------------------------------------------------------------------------------------------
# the layers


class _QuantizedLinear(nn.Module):
    """What both layers share: shape, bias (kept in float, frozen), ``skip_bias_add``, the forward frame."""

    bits: int

    def __init__(self, in_features: int, out_features: int, bias: bool, dtype, device, skip_bias_add: bool):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.skip_bias_add = skip_bias_add
        if bias:
            self.bias = nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device), requires_grad=False)
        else:
            self.register_parameter("bias", None)

    def forward(self, x: torch.Tensor):
        if torch.is_grad_enabled() and x.requires_grad:
            raise RuntimeError(f"{type(self).__name__} is for inference: it has no gradient")
        out = self._product(x.reshape(-1, self.in_features)).reshape(*x.shape[:-1], self.out_features)
        if self.bias is not None and not self.skip_bias_add:
            out = out + self.bias.to(out.dtype)
        return (out, self.bias) if self.skip_bias_add else out

    def _product(self, rows: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _load_bias(self, bias):
        if bias is not None:
            if self.bias is None:
                raise ValueError(f"{type(self).__name__}: a bias was given to a layer built without one")
            self.bias.data = bias.detach().to(self.bias.dtype).clone()


def _int8_kernel_takes(dtype, in_features: int) -> bool:
    """Whether torch's CPU int8 kernel may run: its bf16 path (torch 2.13) crashes the process unless the
    row is a multiple of 16 long, so such rows take the dequantizing product instead."""
    if dtype == torch.bfloat16:
        return in_features % 16 == 0
    return dtype in (torch.float32, torch.float16)


class Int8Linear(_QuantizedLinear):
    """``x @ W.T + b`` with ``W`` stored as int8 and one scale per output row (module docstring)."""

    bits = 8

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, dtype=torch.float32,
                 device=None, skip_bias_add: bool = False):
        super().__init__(in_features, out_features, bias, dtype, device, skip_bias_add)
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=torch.int8, device=device))
        self.register_buffer("weight_scale", torch.ones(out_features, dtype=dtype, device=device))
        self.compute_dtype = None  # pack(dtype): the dtype the CPU kernel runs in (default: the input's)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        weight = linear.weight.detach()
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, dtype=weight.dtype,
                    device=weight.device, skip_bias_add=getattr(linear, "skip_bias_add", False))
        q, scale = quantize_int8(weight)
        layer.weight.copy_(q)
        layer.weight_scale.copy_(scale.to(weight.dtype))
        layer._load_bias(linear.bias)
        return layer

    @property
    def packed(self) -> bool:
        return False  # the int8 kernel reads the saved layout as is: nothing to reorder, state_dict always works

    def pack(self, dtype=None) -> Int8Linear:
        """Nothing to reorder; ``dtype`` (if given): run the CPU kernel in it, the input cast to it and the
        output back (torch's int8 kernel is several times faster in bf16 than in fp32 on CPUs with bf16)."""
        self.compute_dtype = dtype
        return self

    def dequantize(self, dtype=torch.float32) -> torch.Tensor:
        return (self.weight.float() * self.weight_scale.float()[:, None]).to(dtype)

    def _product(self, rows):
        dtype = self.compute_dtype or rows.dtype
        if rows.device.type == "cpu" and _int8_kernel_takes(dtype, self.in_features):
            out = torch.ops.aten._weight_int8pack_mm(rows.to(dtype).contiguous(), self.weight,
                                                     self.weight_scale.to(dtype))
            return out.to(rows.dtype)
        scale = self.weight_scale.to(rows.dtype)  # CUDA and the rest: dequantize in the product
        return F.linear(rows, self.weight.to(rows.dtype)) * scale

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"bits=8, dtype={self.weight_scale.dtype}")


class Int4Linear(_QuantizedLinear):
    """``x @ W.T + b`` with ``W`` stored as int4, a scale and zero per group of ``group_size`` columns."""

    bits = 4

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *, group_size: int = 128,
                 dtype=torch.float32, device=None, skip_bias_add: bool = False):
        _check_group(in_features, group_size)
        super().__init__(in_features, out_features, bias, dtype, device, skip_bias_add)
        self.group_size = group_size
        groups = in_features // group_size
        self.register_buffer("weight", torch.zeros(out_features, in_features // 2, dtype=torch.int8, device=device))
        self.register_buffer("weight_scale", torch.ones(out_features, groups, dtype=dtype, device=device))
        self.register_buffer("weight_zero", torch.zeros(out_features, groups, dtype=dtype, device=device))
        self._kernel = None  # (packed weight, scales_and_zeros, padded rows) once packed

    @classmethod
    def from_linear(cls, linear: nn.Linear, group_size: int = 128) -> Int4Linear:
        weight = linear.weight.detach()
        layer = cls(linear.in_features, linear.out_features, linear.bias is not None, group_size=group_size,
                    dtype=weight.dtype, device=weight.device, skip_bias_add=getattr(linear, "skip_bias_add", False))
        packed, scale, zero = quantize_int4(weight, group_size)
        layer.weight.copy_(packed)
        layer.weight_scale.copy_(scale.to(weight.dtype))
        layer.weight_zero.copy_(zero.to(weight.dtype))
        layer._load_bias(linear.bias)
        return layer

    @property
    def packed(self) -> bool:
        return self._kernel is not None

    def dequantize(self, dtype=torch.float32) -> torch.Tensor:
        if self.packed:
            raise RuntimeError("Int4Linear: the weight is packed for this machine's kernel; dequantize before pack()")
        q = unpack_int4(self.weight).float().reshape(self.out_features, -1, self.group_size)
        w = q * self.weight_scale.float()[..., None] + self.weight_zero.float()[..., None]
        return w.reshape(self.out_features, self.in_features).to(dtype)

    def pack(self, dtype=None) -> Int4Linear:
        """Reorder the weight once for this device's int4 kernel (CPU, or CUDA where its shapes allow);
        the portable bytes are dropped. ``dtype``: the activations' dtype the kernel will run in (default:
        the scales' dtype; an input of another dtype is cast to it and the output back). A no-op where
        there is no kernel: the layer then keeps dequantizing per call."""
        if self.packed:
            return self
        device = self.weight.device
        dtype = dtype or self.weight_scale.dtype
        u = unpack_int4(self.weight).to(torch.int32) + 8  # 0..15, as the kernels take them
        scales_and_zeros = torch.stack([self.weight_scale.t(), self.weight_zero.t()], dim=-1)  # [G, out, 2]
        rows = self.out_features
        if device.type == "cpu" and dtype in (torch.float32, torch.bfloat16, torch.float16):
            pad = -rows % _CPU_ROW_MULTIPLE
            if pad:  # padded rows are zeros with scale 0: their outputs are cut off
                u = torch.cat([u, torch.full((pad, self.in_features), 8, dtype=torch.int32)])
                scales_and_zeros = torch.cat([scales_and_zeros, scales_and_zeros.new_zeros(
                    scales_and_zeros.shape[0], pad, 2)], dim=1)
            packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(u.contiguous(), 2)
        elif device.type == "cuda" and rows % 8 == 0 and self.in_features % (_CUDA_INNER_K_TILES * 16) == 0:
            dtype = torch.bfloat16  # tinygemm computes in bf16
            u8 = ((u[:, 0::2] << 4) | u[:, 1::2]).to(torch.uint8)
            packed = torch.ops.aten._convert_weight_to_int4pack(u8.contiguous(), _CUDA_INNER_K_TILES)
        else:
            return self
        self._kernel = (packed, scales_and_zeros.to(dtype).contiguous(), rows)
        del self.weight, self.weight_scale, self.weight_zero  # the packed copy is the weight now
        self.register_buffer("weight", None)
        return self

    def _product(self, rows):
        if self._kernel is None:
            return F.linear(rows, self.dequantize(rows.dtype))
        packed, scales_and_zeros, n = self._kernel
        if rows.device != packed.device:
            raise RuntimeError(f"Int4Linear: packed on {packed.device}, input on {rows.device}")
        x = rows.to(scales_and_zeros.dtype).contiguous()
        if packed.device.type == "cpu":
            out = torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, self.group_size, scales_and_zeros)
        else:
            out = torch.ops.aten._weight_int4pack_mm(x, packed, self.group_size, scales_and_zeros)
        return out[:, :n].to(rows.dtype)

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        if self.packed:
            raise RuntimeError(f"{prefix.rstrip('.') or 'Int4Linear'}: the int4 weight is packed for this machine's kernel and "
                               "cannot be saved; quantize with pack=False to save, pack_quantized() after loading")
        super()._save_to_state_dict(destination, prefix, keep_vars)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        if self.packed:
            raise RuntimeError(f"{prefix.rstrip('.') or 'Int4Linear'}: load into a layer that is not packed yet, then pack()")
        for name, shape in (("weight", tuple(self.weight.shape)), ("weight_scale", tuple(self.weight_scale.shape)),
                            ("weight_zero", tuple(self.weight_zero.shape))):
            given = state_dict.get(prefix + name)
            if given is not None and tuple(given.shape) != shape:
                raise ValueError(f"{prefix}{name}: shape {tuple(given.shape)} does not match the int4 layer's {shape} "
                                 f"({self.out_features}x{self.in_features}, group size {self.group_size})")
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"bits=4, group_size={self.group_size}, packed={self.packed}")


def from_thudm(weight: torch.Tensor, weight_scale: torch.Tensor, bits: int, bias: torch.Tensor | None = None, *,
               in_features: int | None = None, group_size: int = 128, dtype=None) -> Int8Linear | Int4Linear:
    """A layer from THUDM's quantized tensors (``quantization_bit`` 4 or 8), without dequantizing.

    8 bits: the same layout as :class:`Int8Linear`. 4 bits: the packed bytes are kept as they are (THUDM
    packs in :func:`pack_int4`'s order), the per-row scale repeated over groups of ``group_size`` (it must
    divide the row), zeros of zero. ``dtype``: the scales' dtype (default ``weight_scale``'s; THUDM's
    published checkpoints hold float16). The layer is not packed: call ``pack()``.
    """
    _check_thudm(weight, weight_scale, bits)
    rows = weight.shape[0]
    columns = weight.shape[1] * (2 if bits == 4 else 1)
    if in_features is not None and in_features != columns:
        raise ValueError(f"a {bits}-bit weight of shape {tuple(weight.shape)} holds {columns} input features, "
                         f"not {in_features}")
    dtype = dtype or weight_scale.dtype
    kwargs = dict(bias=bias is not None, dtype=dtype, device=weight.device)
    if bits == 8:
        layer = Int8Linear(columns, rows, **kwargs)
        layer.weight.copy_(weight)
        layer.weight_scale.copy_(weight_scale.to(dtype))
    else:
        layer = Int4Linear(columns, rows, group_size=group_size, **kwargs)
        layer.weight.copy_(weight)
        layer.weight_scale.copy_(weight_scale.to(dtype)[:, None].expand_as(layer.weight_scale))
    if bias is not None:
        layer.bias.data = bias.detach().to(dtype).clone()
    return layer


# ---------------------------------------------------------------------------------------------------------
# whole models


def _swappable(child: nn.Module) -> bool:
    """A plain ``nn.Linear`` (or an unsplit ``shim.nn.Linear1D``) with a 2-D float weight, no DTensor."""
    if not (type(child) is nn.Linear or isinstance(child, nn.Linear) and hasattr(child, "parallel")):
        return False  # another subclass may compute more than x @ W.T + b
    weight = child.weight
    return type(weight) in (torch.Tensor, nn.Parameter) and weight.dim() == 2 and weight.is_floating_point()


def quantize_linears(model: nn.Module, bits: int, *, group_size: int = 128, skip=(), pack: bool = True,
                     dtype=None) -> int:
    """Replace ``model``'s linear layers by :class:`Int8Linear` (``bits=8``) or :class:`Int4Linear` (``bits=4``)
    in place; return how many.

    ``skip``: module names (``fnmatch`` patterns over ``named_modules`` names, e.g. ``"*output_layer"`` or
    ``"lm_head"``) to keep in full precision. ``pack`` (int4): reorder each weight for this device's kernel
    now (inference only, no ``state_dict``); ``pack=False`` keeps the saveable layout. ``dtype``: the
    activation dtype the CPU kernels run in (default: the input's for int8, the weights' for int4; an input
    of another dtype is cast to it and the output back). Embeddings, norms, linears
    split by tensor parallelism (DTensor weights) and linear subclasses other than ``Linear1D`` are kept.
    A group size that does not divide a layer's row is a ValueError, raised before anything is replaced.
    """
    if bits not in (4, 8):
        raise ValueError(f"quantize: bits must be 4 or 8, got {bits}")
    patterns = [skip] if isinstance(skip, str) else list(skip)
    targets = []
    for name, module in model.named_modules():
        for child_name, child in module.named_children():
            qualified = f"{name}.{child_name}" if name else child_name
            if _swappable(child) and not any(fnmatchcase(qualified, p) for p in patterns):
                if bits == 4:
                    try:
                        _check_group(child.in_features, group_size)
                    except ValueError as error:
                        raise ValueError(f"{qualified}: {error}") from None
                targets.append((module, child_name, child))
    for module, child_name, child in targets:
        if bits == 8:
            layer = Int8Linear.from_linear(child).pack(dtype)
        else:
            layer = Int4Linear.from_linear(child, group_size)
            if pack:
                layer.pack(dtype)
        setattr(module, child_name, layer)
    return len(targets)


def pack_quantized(model: nn.Module, dtype=None) -> int:
    """Pack every quantized layer of ``model`` not packed yet (after ``load_state_dict``): int4 weights
    reordered for this device's kernel, ``dtype`` set as :func:`quantize_linears`'s; return how many."""
    count = 0
    for module in model.modules():
        if isinstance(module, (Int8Linear, Int4Linear)) and not module.packed:
            module.pack(dtype)
            count += 1
    return count
