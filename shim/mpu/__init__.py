"""Megatron's ``mpu`` surface, as GLM-era code calls it, on the DeviceMesh of :mod:`shim.distributed`.

``initialize_model_parallel(n)`` is ``setup_layout(tensor_parallel_size=n)``;
the groups are the mesh's ``tp`` ("model parallel") and ``dp`` dims; the layers
are :mod:`shim.nn.tensor_parallel`'s (DTensor weights); the region functions
are DTensor redistributions; ``checkpoint`` and the RNG tracker are
:mod:`shim.recompute`'s, which replays the tracker on recompute; ``LayerNorm``
is ``shim.nn.FusedLayerNorm`` (apex's, which upstream's ``mpu`` re-exports).
"""

from shim.recompute import checkpoint, get_cuda_rng_tracker, model_parallel_cuda_manual_seed
from shim.mpu.cross_entropy import vocab_parallel_cross_entropy
from shim.mpu.data import broadcast_data
from shim.mpu.grads import clip_grad_norm
from shim.mpu.initialize import (
    destroy_model_parallel,
    get_data_parallel_group,
    get_data_parallel_rank,
    get_data_parallel_world_size,
    get_model_parallel_group,
    get_model_parallel_rank,
    get_model_parallel_src_rank,
    get_model_parallel_world_size,
    initialize_model_parallel,
    model_parallel_is_initialized,
)
from shim.mpu.layers import ColumnParallelLinear, ParallelEmbedding, RowParallelLinear, VocabParallelEmbedding
from shim.mpu.mappings import (
    copy_to_model_parallel_region,
    gather_from_model_parallel_region,
    reduce_from_model_parallel_region,
    scatter_to_model_parallel_region,
)
from shim.nn.normalization import FusedLayerNorm as LayerNorm  # upstream mpu re-exports apex's
from shim.mpu.utils import VocabUtility, divide, ensure_divisibility, split_tensor_along_last_dim

__all__ = [
    "ColumnParallelLinear",
    "LayerNorm",
    "ParallelEmbedding",
    "RowParallelLinear",
    "VocabParallelEmbedding",
    "VocabUtility",
    "broadcast_data",
    "checkpoint",
    "clip_grad_norm",
    "copy_to_model_parallel_region",
    "destroy_model_parallel",
    "divide",
    "ensure_divisibility",
    "gather_from_model_parallel_region",
    "get_cuda_rng_tracker",
    "get_data_parallel_group",
    "get_data_parallel_rank",
    "get_data_parallel_world_size",
    "get_model_parallel_group",
    "get_model_parallel_rank",
    "get_model_parallel_src_rank",
    "get_model_parallel_world_size",
    "initialize_model_parallel",
    "model_parallel_cuda_manual_seed",
    "model_parallel_is_initialized",
    "reduce_from_model_parallel_region",
    "scatter_to_model_parallel_region",
    "split_tensor_along_last_dim",
    "vocab_parallel_cross_entropy",
]
