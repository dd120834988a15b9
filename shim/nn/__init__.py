"""torch.nn plus apex-compatible and tensor-parallel layers."""

import torch.nn as _torch_nn

from shim._forward import forward_to as _forward_to
from shim.nn.fused_dense import FusedDense, FusedDenseGeluDense  # noqa: F401 (exported)
from shim.nn.normalization import (  # noqa: F401 (exported)
    FastLayerNorm,
    FusedLayerNorm,
    FusedLayerNormAffineFunction,
    FusedRMSNorm,
    MixedFusedLayerNorm,
    MixedFusedRMSNorm,
)
from shim.nn.packed_linear import PackedLinear, pack_linears  # noqa: F401 (exported)
from shim.nn.quantized import Int4Linear, Int8Linear, pack_quantized, quantize_linears  # noqa: F401 (exported)
from shim.nn.softmax import AttnMaskType, FusedScaleMaskSoftmax  # noqa: F401 (exported)
from shim.nn.tensor_parallel import Linear1D, VocabParallelEmbedding, heads_per_rank  # noqa: F401 (exported)

__getattr__, __dir__ = _forward_to(_torch_nn, globals())

# shim's functional (torch's plus fused ops) must win over torch.nn.functional on attribute access.
import shim.nn.functional as functional  # noqa: E402, F401
