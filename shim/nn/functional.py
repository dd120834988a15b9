"""torch.nn.functional plus fused ops (their kernels live in :mod:`shim.ops`).

- ``sparse_softmax_cross_entropy(logits, labels, *, process_group=None)``
- ``fused_bias_add_gelu(x, bias, approximate="tanh")``
- ``fused_bias_add_dropout(x, bias, p, training=True, residual=None)``
- ``fused_masked_attention(q, k, v, visible, dropout_p=0.0)``

Every other name is torch.nn.functional's own object.
"""

import torch.nn.functional as _torch_functional

from shim._forward import forward_to as _forward_to
from shim.ops.attention import fused_masked_attention  # noqa: F401 (exported)
from shim.ops.bias_act import fused_bias_add_gelu  # noqa: F401 (exported)
from shim.ops.bias_dropout import fused_bias_add_dropout  # noqa: F401 (exported)
from shim.ops.cross_entropy import sparse_softmax_cross_entropy  # noqa: F401 (exported)

__getattr__, __dir__ = _forward_to(_torch_functional, globals())
