"""DeepSpeed's name for :mod:`shim.recompute` (activation recompute): ``deepspeed.checkpointing``.

Migrated code imports ``shim.checkpointing`` (rules/deepspeed.toml), and ``shim.deepspeed.checkpointing``
is this module. Every name here is :mod:`shim.recompute`'s own object, so its state
(``configure``'s settings, the RNG tracker) is one and the same. Saving checkpoints to disk
is unrelated: that is glm_port's checkpoint I/O.
"""

from shim.recompute import (
    MODEL_PARALLEL_RNG,
    RNGStatesTracker,
    checkpoint,
    configure,
    get_cuda_rng_tracker,
    is_configured,
    model_parallel_cuda_manual_seed,
    reset,
    save_matmuls,
)

__all__ = [
    "MODEL_PARALLEL_RNG",
    "RNGStatesTracker",
    "checkpoint",
    "configure",
    "get_cuda_rng_tracker",
    "is_configured",
    "model_parallel_cuda_manual_seed",
    "reset",
    "save_matmuls",
]
