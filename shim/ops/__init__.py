"""Fused kernels behind ``shim.nn.functional``, one module per op family.

- :mod:`shim.ops.cross_entropy`: ``sparse_softmax_cross_entropy`` (OneFlow's op):
  per-position loss from logits and integer labels, one logits-sized buffer in backward.
- :mod:`shim.ops.bias_act`: ``fused_bias_add_gelu`` (GLM's tanh GELU of ``x + bias``).
- :mod:`shim.ops.bias_dropout`: ``fused_bias_add_dropout`` (``dropout(x + bias) + residual``).
- :mod:`shim.ops.attention`: ``fused_masked_attention`` (boolean-masked attention with dropout;
  SDPA on CUDA, a blocked kernel on CPU, where SDPA has none with dropout).
- :mod:`shim.ops.dropout_mask`: ``keep_mask`` / ``apply_keep``, the dropout masks of the CPU paths.
- :mod:`shim.ops.vocab_parallel_cross_entropy`: the vocab-sharded cross entropy (owned by
  the distributed part; ``sparse_softmax_cross_entropy`` delegates to it).

Each op has a CPU path written as an autograd.Function over in-place torch ops, and a
CUDA path that ``torch.compile`` builds on first use (:mod:`shim.ops._cuda`).
"""
