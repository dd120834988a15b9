"""What the fused ops allocate and save, counted exactly (and the composed forms, to show the count works).

Large allocations are counted with a TorchDispatchMode that sees every ATen op, forward and
backward, and records each output storage at least as large as the input; it keeps those
tensors alive so the allocator cannot hand one address out twice. Saved tensors are
counted with saved_tensors_hooks.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

import shim.nn.functional as F
from shim.ops import softmax_rows


class LargeAllocations(TorchDispatchMode):
    def __init__(self, like: torch.Tensor, *inputs: torch.Tensor):
        super().__init__()
        self.nbytes = like.untyped_storage().nbytes()
        self.inputs = {t.untyped_storage().data_ptr() for t in (like, *inputs)}
        self.kept = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.untyped_storage().nbytes() >= self.nbytes:
                self.kept.append(t)
        return out

    @property
    def count(self) -> int:
        return len({t.untyped_storage().data_ptr() for t in self.kept} - self.inputs)


def saved_tensors(fn):
    saved = []

    def pack(t):
        saved.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, saved


def mpu_formula(logits, labels):
    shifted = logits - logits.max(dim=-1, keepdim=True).values
    return shifted.exp().sum(dim=-1).log() - shifted.gather(-1, labels[..., None]).squeeze(-1)


def cross_entropy_inputs(dtype):
    logits = torch.randn(15, 97).to(dtype).requires_grad_()
    return logits, torch.randint(0, 97, (15,))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cross_entropy_allocates_one_logits_sized_buffer(dtype, monkeypatch):
    monkeypatch.setattr(softmax_rows, "_BLOCK_ELEMENTS", 4 * 97)  # blocks smaller than the logits
    logits, labels = cross_entropy_inputs(dtype)
    with LargeAllocations(logits, labels) as fused:
        (grad,) = torch.autograd.grad(F.sparse_softmax_cross_entropy(logits, labels).sum(), logits)
    assert fused.count == 1
    assert fused.kept[-1].data_ptr() == grad.data_ptr()  # that buffer is the gradient

    with LargeAllocations(logits, labels) as composed:
        torch.autograd.grad(mpu_formula(logits.float(), labels).sum(), logits)
    assert composed.count >= 3


def test_cross_entropy_saves_at_most_one_logits_sized_tensor():
    for dtype in (torch.float32, torch.bfloat16):
        logits, labels = cross_entropy_inputs(dtype)
        _, saved = saved_tensors(lambda: F.sparse_softmax_cross_entropy(logits, labels))
        large = [t for t in saved if t.numel() == logits.numel()]
        assert len(large) == 1, dtype
        if dtype == torch.bfloat16:  # the logits themselves, no copy
            assert large[0].data_ptr() == logits.data_ptr()


def gelu_inputs():
    return torch.randn(8, 64, requires_grad=True), torch.randn(64, requires_grad=True)


def test_bias_gelu_allocates_one_buffer_each_way():
    x, bias = gelu_inputs()
    grad = torch.randn(8, 64)
    with LargeAllocations(x, grad) as fused:
        torch.autograd.grad(F.fused_bias_add_gelu(x, bias), (x, bias), grad)
    with LargeAllocations(x, grad) as composed:
        torch.autograd.grad(torch.nn.functional.gelu(x + bias, approximate="tanh"), (x, bias), grad)
    assert fused.count == 2  # the output, the input gradient
    assert composed.count == 3  # plus the sum x + bias


def test_bias_gelu_saves_only_its_inputs():
    x, bias = gelu_inputs()
    _, saved = saved_tensors(lambda: F.fused_bias_add_gelu(x, bias))
    assert {t.data_ptr() for t in saved} == {x.data_ptr(), bias.data_ptr()}


def test_bias_dropout_allocates_one_output_and_the_random_bits_and_saves_a_bool_mask():
    x, bias = gelu_inputs()
    residual = torch.randn(8, 64)
    with LargeAllocations(x, residual) as fused:
        _, saved = saved_tensors(lambda: F.fused_bias_add_dropout(x, bias, 0.1, residual=residual))
    with LargeAllocations(x, residual) as composed:
        _, composed_saved = saved_tensors(lambda: torch.nn.functional.dropout(x + bias, 0.1) + residual)
    # The output, and the random bits keep_mask reads (transient). The mul kernel's widened copy of the
    # mask is internal to ATen, unseen here: bench/fused_elementwise.py measures the whole peak.
    assert fused.count == 2
    assert composed.count == 4  # sum, float noise, dropped, residual sum
    assert [t.dtype for t in saved] == [torch.bool]
    # torch's CPU dropout keeps its mask as a float tensor: 4 bytes an element, not 1
    assert torch.float32 in {t.dtype for t in composed_saved if t.shape == x.shape}
