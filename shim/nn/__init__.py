"""torch.nn plus apex-compatible and tensor-parallel layers."""

import torch.nn as _torch_nn

from shim._forward import forward_to as _forward_to
from shim._lazy import lazy_names as _lazy_names

# name -> module that defines it (imported on first use)
_OWN = {
    "FusedLayerNorm": "shim.nn.normalization",
    "MixedFusedLayerNorm": "shim.nn.normalization",
    "Linear1D": "shim.nn.tensor_parallel",
    "VocabParallelEmbedding": "shim.nn.tensor_parallel",
}

_torch_getattr, _torch_dir = _forward_to(_torch_nn, globals())
__getattr__ = _lazy_names(globals(), _OWN, _torch_getattr)


def __dir__():
    return sorted(set(_torch_dir()) | set(_OWN))

# shim's functional (torch's plus fused ops) must win over torch.nn.functional on attribute access.
import shim.nn.functional as functional  # noqa: E402
