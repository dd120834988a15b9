"""CPU inference on oneDNN's prepacked linear weights.

On a CPU, ``F.linear`` hands each product to a BLAS that reads the weight in its plain row-major
layout on every call. oneDNN (``torch.backends.mkldnn``, built into PyTorch's CPU wheels) can first
reorder a weight into its blocked layout for a given batch size (``torch.ops.mkldnn.
_reorder_linear_weight``), then multiply against it (``torch.ops.mkldnn._linear_pointwise``): the
pair inductor's freezing pass emits for a frozen bf16 ``nn.Linear`` on CPU (fp32 it packs for MKL,
slower here), used here without compiling the model. At the small row counts of decoding (one row per
sequence) the packed product streams the weight closer to the memory bandwidth, and at a few rows it
avoids the BLAS's small-matrix slowdown (docs/generation.md, "CPU: packed linear weights", has the
figures; ``bench.packed_linear`` times the products, ``bench.chatglm2`` and ``bench.generate`` the
end-to-end rows).

Which is faster depends on the shape and the machine, so :func:`pack_linears` times both on each
distinct weight shape (``batch_size`` rows, the decode step's) and packs only the shapes where the
packed product wins. The packed weight *replaces* the dense one: memory stays one copy of the weights,
and the model is then for inference only (no gradients, no ``state_dict``: load it again to train or
save). Weights on other devices, in other dtypes, or split across ranks (DTensor) are left as they are.
"""

from __future__ import annotations

import time

import torch
from torch import nn

__all__ = ["PackedLinear", "pack_linears", "packable"]

_DTYPES = (torch.float32, torch.bfloat16)


def packable(weight: torch.Tensor) -> bool:
    """Whether oneDNN can pack ``weight``: a plain CPU tensor in fp32 (or bf16 where the CPU has bf16)."""
    if type(weight) not in (torch.Tensor, nn.Parameter) or weight.device.type != "cpu" or weight.dim() != 2:
        return False
    if not torch.backends.mkldnn.is_available() or weight.dtype not in _DTYPES:
        return False
    return weight.dtype != torch.bfloat16 or torch.ops.mkldnn._is_mkldnn_bf16_supported()


class PackedLinear(nn.Module):
    """An inference-only ``nn.Linear`` whose weight lives in oneDNN's packed layout.

    Built from an ``nn.Linear`` (or ``shim.nn.Linear1D`` with no tensor-parallel split, whose
    ``skip_bias_add`` is kept: ``forward`` then returns ``(x @ W.T, bias)``).
    """

    def __init__(self, linear: nn.Linear, batch_size: int = 1, packed: torch.Tensor | None = None):
        """``packed``: the weight already reordered for ``batch_size`` (``pack_linears`` reuses the one it timed)."""
        super().__init__()
        if not packable(linear.weight):
            raise ValueError(f"PackedLinear: cannot pack a {tuple(linear.weight.shape)} {linear.weight.dtype} weight "
                             f"on {linear.weight.device} (plain CPU fp32/bf16 only)")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.skip_bias_add = getattr(linear, "skip_bias_add", False)
        self.packed = _reorder(linear, batch_size) if packed is None else packed
        self.bias = linear.bias

    def forward(self, x: torch.Tensor):
        if torch.is_grad_enabled() and x.requires_grad:
            raise RuntimeError("PackedLinear is for inference: it has no gradient (load the model again to train)")
        if x.dtype != self.packed.dtype:
            raise RuntimeError(f"PackedLinear: input is {x.dtype}, the packed weight {self.packed.dtype}")
        bias = None if self.skip_bias_add or self.bias is None else self.bias.detach()
        rows = x.reshape(-1, self.in_features)
        out = torch.ops.mkldnn._linear_pointwise(rows, self.packed, bias, "none", [None], "")
        out = out.reshape(*x.shape[:-1], self.out_features)
        return (out, self.bias) if self.skip_bias_add else out

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        raise RuntimeError(f"{prefix}: the weight is packed for CPU inference and cannot be saved; "
                           "load the model again (without pack_linears) to save it")

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
                f"dtype={self.packed.dtype}")


def _reorder(linear: nn.Linear, batch_size: int) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach(), batch_size)


def _median_seconds(run, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def _packing_wins(linear: nn.Linear, packed: torch.Tensor, batch_size: int, repeats: int) -> bool:
    """Time the plain and the packed product on ``batch_size`` rows, alternating; True if packed is faster."""
    weight = linear.weight.detach()
    x = torch.randn(batch_size, linear.in_features, dtype=weight.dtype)
    plain_run = lambda: torch.nn.functional.linear(x, weight)  # noqa: E731
    packed_run = lambda: torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [None], "")  # noqa: E731
    with torch.no_grad():
        plain_run(), packed_run()  # first calls pay for allocation and oneDNN's primitive creation
        plain, fast = [], []
        for _ in range(repeats):
            plain.append(_median_seconds(plain_run, 3))
            fast.append(_median_seconds(packed_run, 3))
    return sorted(fast)[len(fast) // 2] < sorted(plain)[len(plain) // 2]


def pack_linears(model: nn.Module, *, batch_size: int = 1, measure: bool = True, repeats: int = 5) -> int:
    """Replace ``model``'s packable ``nn.Linear`` layers by :class:`PackedLinear`, in place; return how many.

    ``batch_size``: the rows a product will mostly see (a decode step: the batch). With ``measure``
    (the default), each distinct (shape, dtype) is timed once, plain against packed, and only the
    shapes where packing is faster are packed; ``measure=False`` packs every packable layer.
    Linears under tensor parallelism (DTensor weights), on other devices or in other dtypes are kept.
    """
    decided: dict[tuple, bool] = {}
    replaced = 0
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if not (type(child) is nn.Linear or isinstance(child, nn.Linear) and hasattr(child, "parallel")):
                continue  # another subclass may compute more than x @ W.T + b; Linear1D computes just that
            if not packable(child.weight):  # DTensor (tensor-parallel), other devices and dtypes stay
                continue
            key = (tuple(child.weight.shape), child.weight.dtype)
            packed = None
            if key not in decided:
                packed = _reorder(child, batch_size)
                decided[key] = not measure or _packing_wins(child, packed, batch_size, repeats)
            if decided[key]:
                setattr(module, name, PackedLinear(child, batch_size, packed))
                replaced += 1
    return replaced
