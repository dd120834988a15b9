"""torch.nn plus apex-compatible and tensor-parallel layers."""

import torch.nn as _torch_nn

from shim._forward import forward_to as _forward_to

# name -> module that defines it (imported on first use)
_OWN = {
    "FusedLayerNorm": "shim.nn.normalization",
    "MixedFusedLayerNorm": "shim.nn.normalization",
    "Linear1D": "shim.nn.tensor_parallel",
    "VocabParallelEmbedding": "shim.nn.tensor_parallel",
    "heads_per_rank": "shim.nn.tensor_parallel",
}

__getattr__, __dir__ = _forward_to(_torch_nn, globals(), own=_OWN)

# shim's functional (torch's plus fused ops) must win over torch.nn.functional on attribute access.
import shim.nn.functional as functional  # noqa: E402
