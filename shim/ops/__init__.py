"""Fused kernels behind ``shim.nn.functional``, one module per op family.

- :mod:`shim.ops.cross_entropy`: ``sparse_softmax_cross_entropy`` (OneFlow's op):
  per-position loss from logits and integer labels, one logits-sized buffer in backward.
- :mod:`shim.ops.bias_act`: ``fused_bias_add_gelu`` (GLM's tanh GELU of ``x + bias``).
- :mod:`shim.ops.bias_dropout`: ``fused_bias_add_dropout`` (``dropout(x + bias) + residual``).
- :mod:`shim.ops.attention`: ``fused_masked_attention`` (boolean-masked attention with dropout;
  SDPA on CUDA, a blocked kernel on CPU, where SDPA has none with dropout).
- :mod:`shim.ops.dropout_mask`: ``keep_mask`` / ``apply_keep``, the dropout masks of the CPU paths.
- :mod:`shim.ops.vocab_parallel_cross_entropy`: the vocab-sharded cross entropy, on the
  process group its caller passes (``sparse_softmax_cross_entropy`` delegates to it).
- :mod:`shim.ops.softmax_rows`: the logsumexp and ``softmax - onehot`` steps both
  cross-entropy ops share.

Each op has a CPU path written as an autograd.Function over in-place torch ops, and a
CUDA path that ``torch.compile`` builds on first use (:mod:`shim.ops._cuda`).

Ops are the bottom layer of shim: a module here imports torch and other ``shim.ops``
modules, nothing else of shim (``tests/test_architecture.py`` checks it). Adding an op:
a module here with ``__all__``, its name added to ``shim.nn.functional``, a test in
``tests/shim/test_ops_<name>.py`` against torch's composed formula.
"""

from shim.ops import attention, bias_act, bias_dropout, cross_entropy, dropout_mask, softmax_rows
from shim.ops import vocab_parallel_cross_entropy

__all__ = [
    "attention",
    "bias_act",
    "bias_dropout",
    "cross_entropy",
    "dropout_mask",
    "softmax_rows",
    "vocab_parallel_cross_entropy",
]
