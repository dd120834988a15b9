"""Activation recompute: drop a region's activations in forward, recompute them in backward.

Not checkpoint *files* (saving and loading weights is glm_port's checkpoint I/O). DeepSpeed
and Megatron call this "activation checkpointing"; their API is served here on
``torch.utils.checkpoint``, and :mod:`shim.checkpointing` is the same module's names under
DeepSpeed's name (``deepspeed.checkpointing``), which migrated code imports.

GLM-era code does::

    deepspeed.checkpointing.configure(mpu, deepspeed_config=..., num_checkpoints=n)
    with get_cuda_rng_tracker().fork():      # dropout in tensor-parallel regions
        ...
    out = checkpoint(layer_fn, hidden, mask)

``checkpoint`` recomputes through ``torch.utils.checkpoint`` (non-reentrant),
which already replays the default CPU and device generators; the named streams
of the :class:`RNGStatesTracker` are replayed too, so dropout inside a
checkpointed region draws the same masks on recompute as in the forward pass.
The tracker works on shim's active device (``shim.device()``): the CUDA
generator on a GPU, the CPU generator otherwise.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import warnings

import torch
import torch.utils.checkpoint

from shim._device import active_device

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

# The stream name Megatron and DeepSpeed use for tensor-parallel dropout.
MODEL_PARALLEL_RNG = "model-parallel-rng"
# Added to the seed for the tensor-parallel stream (Megatron's offset), so it
# never equals the data-parallel seed.
_MODEL_PARALLEL_SEED_OFFSET = 2718


def _device_type() -> str:
    return active_device().type


def _get_rng_state() -> torch.Tensor:
    device = _device_type()
    return torch.get_rng_state() if device == "cpu" else torch.get_device_module(device).get_rng_state()


def _set_rng_state(state: torch.Tensor) -> None:
    device = _device_type()
    if device == "cpu":
        torch.set_rng_state(state)
    else:
        torch.get_device_module(device).set_rng_state(state)


class RNGStatesTracker:
    """Named RNG streams on the active device (Megatron's ``CudaRNGStatesTracker``, device-agnostic).

    ``add(name, seed)`` starts a stream; ``with fork(name):`` draws from it and
    leaves the default generator where it was.
    """

    def __init__(self):
        self._states: dict[str, torch.Tensor] = {}
        self._seeds: set[int] = set()

    def reset(self) -> None:
        self._states, self._seeds = {}, set()

    def get_states(self) -> dict[str, torch.Tensor]:
        return dict(self._states)

    def set_states(self, states: dict[str, torch.Tensor]) -> None:
        self._states = dict(states)

    def add(self, name: str, seed: int) -> None:
        if seed in self._seeds:
            raise ValueError(f"RNG seed {seed} is already tracked")
        if name in self._states:
            raise ValueError(f"RNG stream {name!r} is already tracked")
        self._seeds.add(seed)
        self._states[name] = torch.Generator(_device_type()).manual_seed(seed).get_state()

    @contextlib.contextmanager
    def fork(self, name: str = MODEL_PARALLEL_RNG):
        if name not in self._states:
            raise KeyError(f"RNG stream {name!r} is not tracked; call add() or model_parallel_cuda_manual_seed() first")
        outside = _get_rng_state()
        _set_rng_state(self._states[name])
        try:
            yield
        finally:
            self._states[name] = _get_rng_state()
            _set_rng_state(outside)


_TRACKER = RNGStatesTracker()


def get_cuda_rng_tracker() -> RNGStatesTracker:
    return _TRACKER


def _model_parallel_rank() -> int:
    if _config.mpu is not None:
        return _config.mpu.get_model_parallel_rank()
    from shim.distributed.layout import current_layout

    layout = current_layout()
    return layout.tensor_parallel_rank if layout is not None else 0


def model_parallel_cuda_manual_seed(seed: int) -> None:
    """Seed the default generator with ``seed`` (same on every tensor-parallel rank) and the
    tracker's tensor-parallel stream with ``seed + 2718 + tp_rank`` (different on each)."""
    if _device_type() == "cpu":
        torch.manual_seed(seed)
    else:
        torch.get_device_module(_device_type()).manual_seed(seed)
    _TRACKER.reset()
    _TRACKER.add(MODEL_PARALLEL_RNG, seed + _MODEL_PARALLEL_SEED_OFFSET + _model_parallel_rank())


@dataclasses.dataclass
class _Config:
    configured: bool = False
    mpu: object = None  # anything with get_model_parallel_rank(), e.g. an mpu module
    num_checkpoints: int | None = None
    synchronize: bool = False
    profile: bool = False


_config = _Config()

# DeepSpeed's config-file keys -> configure() arguments.
_DEEPSPEED_KEYS = {
    "partition_activations": "partition_activations",
    "contiguous_memory_optimization": "contiguous_checkpointing",
    "number_checkpoints": "num_checkpoints",
    "cpu_checkpointing": "checkpoint_in_cpu",
    "synchronize_checkpoint_boundary": "synchronize",
    "profile": "profile",
}


def _read_deepspeed_config(deepspeed_config) -> dict:
    if isinstance(deepspeed_config, (str, os.PathLike)):
        with open(deepspeed_config) as f:
            deepspeed_config = json.load(f)
    section = deepspeed_config.get("activation_checkpointing", {})
    return {_DEEPSPEED_KEYS[key]: value for key, value in section.items() if key in _DEEPSPEED_KEYS}


def configure(
    mpu_=None,
    deepspeed_config=None,
    partition_activations=None,
    contiguous_checkpointing=None,
    num_checkpoints=None,
    checkpoint_in_cpu=None,
    synchronize=None,
    profile=None,
) -> None:
    """Configure checkpointing as ``deepspeed.checkpointing.configure`` does.

    ``deepspeed_config`` (a path to the JSON file or its dict) supplies the
    ``activation_checkpointing`` section; explicit arguments override it.
    ``mpu_`` supplies the tensor-parallel rank for ``model_parallel_cuda_manual_seed``.
    ``partition_activations``, ``contiguous_checkpointing`` and ``checkpoint_in_cpu``
    are DeepSpeed's layouts for the inputs it keeps; this checkpoint keeps them as
    autograd does, so asking for them only warns.
    """
    options = _read_deepspeed_config(deepspeed_config) if deepspeed_config is not None else {}
    explicit = {
        "partition_activations": partition_activations,
        "contiguous_checkpointing": contiguous_checkpointing,
        "num_checkpoints": num_checkpoints,
        "checkpoint_in_cpu": checkpoint_in_cpu,
        "synchronize": synchronize,
        "profile": profile,
    }
    options.update({key: value for key, value in explicit.items() if value is not None})
    for layout_option in ("partition_activations", "contiguous_checkpointing", "checkpoint_in_cpu"):
        if options.get(layout_option):
            warnings.warn(f"shim.checkpointing: {layout_option} has no effect (inputs are kept as autograd keeps them)")
    if mpu_ is not None:
        _config.mpu = mpu_
    _config.num_checkpoints = options.get("num_checkpoints")
    _config.synchronize = bool(options.get("synchronize", False))
    _config.profile = bool(options.get("profile", False))
    _config.configured = True


def is_configured() -> bool:
    return _config.configured


def reset() -> None:
    """DeepSpeed frees its contiguous checkpoint buffers here; this checkpoint has none.

    Kept so evaluation loops that call it run unchanged.
    """


def _synchronize() -> None:
    if _config.synchronize and _device_type() != "cpu":
        torch.accelerator.synchronize()


def checkpoint(function, *args, policy=None):
    """``function(*args)`` without keeping its activations; recomputed in backward with the
    same default-generator and tracker RNG states as the forward pass.

    ``policy`` makes it selective: a ``torch.utils.checkpoint`` policy function naming the ops whose
    outputs are kept (:func:`save_matmuls` keeps the matmuls'); everything else is recomputed.
    """
    states_at_forward = _TRACKER.get_states()

    @contextlib.contextmanager
    def replay_tracker():
        states_now = _TRACKER.get_states()
        _TRACKER.set_states(states_at_forward)
        try:
            yield
        finally:
            _TRACKER.set_states(states_now)

    if _config.profile:
        profile = torch.profiler.record_function("shim.checkpointing.checkpoint")
    else:
        profile = contextlib.nullcontext()
    with profile:
        _synchronize()
        outputs = torch.utils.checkpoint.checkpoint(
            function, *args, use_reentrant=False, context_fn=lambda: _contexts(policy, replay_tracker)
        )
        _synchronize()
    return outputs


def _contexts(policy, replay_tracker):
    """(forward, recompute) contexts: selective checkpointing's caching modes when ``policy`` is given."""
    if policy is None:
        return contextlib.nullcontext(), replay_tracker()
    caching, cached = torch.utils.checkpoint.create_selective_checkpoint_contexts(policy)

    @contextlib.contextmanager
    def recompute():
        with cached, replay_tracker():
            yield

    return caching, recompute()


# What selective checkpointing keeps: the outputs of the matmuls (the costly ops, whose outputs are a
# few hidden-sized tensors per layer) and of all-reduces (so recomputing does not communicate again).
# LayerNorms, GELU, dropout masks, residual adds and attention are recomputed. Attention is recomputed
# even on GPU, where its kernel is costly: every op that draws random numbers must run again (SDPA's
# kernels draw their dropout), since a kept one would not advance the generator on recompute and the
# dropout masks after it would differ from the forward pass's.
_KEPT_OPS = frozenset({
    torch.ops.aten.mm.default,
    torch.ops.aten.addmm.default,
    torch.ops._c10d_functional.all_reduce.default,
})


def save_matmuls(ctx, op, *args, **kwargs):
    """Selective checkpointing policy: keep matmul and all-reduce outputs, recompute the rest."""
    policy = torch.utils.checkpoint.CheckpointPolicy
    return policy.MUST_SAVE if op in _KEPT_OPS else policy.PREFER_RECOMPUTE
