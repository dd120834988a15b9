"""DeepSpeed's start-up surface, usable without DeepSpeed installed.

Migrated code imports ``shim.deepspeed as deepspeed``. What GLM-era scripts call on
every run works here on ``shim.distributed``: ``init_distributed``,
``add_config_arguments`` and ``checkpointing`` (``shim.checkpointing``). Everything
else (``initialize``, ZeRO, ``ops``) is the real DeepSpeed's, imported on first use,
so a run that never asks for the engine (no ``--deepspeed``) never needs DeepSpeed.
glm-mock serves the same functions for unmodified code.
"""

from __future__ import annotations

import argparse
import importlib
import os

import torch

import shim.distributed as dist
from shim import checkpointing

__all__ = ["add_config_arguments", "checkpointing", "init_distributed"]

_forwarding: set[str] = set()  # names being looked up in the real DeepSpeed (a stand-in may point back here)


def __getattr__(name: str):
    if name.startswith("__") or name in _forwarding:
        raise AttributeError(f"module 'shim.deepspeed' has no attribute {name!r}")
    _forwarding.add(name)
    try:
        real = importlib.import_module("deepspeed")
        return getattr(real, name)
    except ImportError as exc:
        raise AttributeError(
            f"deepspeed.{name} needs DeepSpeed itself (pip install deepspeed); without it only "
            f"{', '.join(__all__)} are available"
        ) from exc
    finally:
        _forwarding.discard(name)


def init_distributed(
    dist_backend=None,
    auto_mpi_discovery=True,
    distributed_port=29500,
    verbose=True,
    timeout=None,
    init_method=None,
    dist_init_required=None,
    config=None,
    rank=-1,
    world_size=-1,
):
    """DeepSpeed's semantics: a no-op when a process group exists; otherwise an env://
    rendezvous (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT as torchrun sets them),
    or a group of one when the process was started without any of them.
    ``auto_mpi_discovery`` and ``config`` are accepted and unused: MPI discovery
    needs the real DeepSpeed."""
    if dist_init_required is False or dist.is_initialized():
        return
    backend = dist_backend or ("nccl" if torch.cuda.is_available() else "gloo")
    kwargs = {} if timeout is None else {"timeout": timeout}
    launched = init_method is not None or "RANK" in os.environ or rank >= 0
    if launched:
        os.environ.setdefault("MASTER_PORT", str(distributed_port))
        kwargs.update(init_method=init_method or "env://", rank=rank, world_size=world_size)
    else:
        kwargs.update(store=dist.HashStore(), rank=0, world_size=1)
    if verbose:
        print(f"shim.deepspeed: initializing torch.distributed ({backend}) for deepspeed.init_distributed", flush=True)
    dist.init_process_group(backend=backend, **kwargs)


def add_config_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The flags DeepSpeed adds to a training script's parser, same names and defaults."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument(
        "--deepspeed",
        default=False,
        action="store_true",
        help="enable the DeepSpeed engine (needs DeepSpeed installed)",
    )
    group.add_argument("--deepspeed_config", default=None, type=str, help="DeepSpeed json configuration file")
    group.add_argument("--deepscale", default=False, action="store_true", help=argparse.SUPPRESS)
    group.add_argument("--deepscale_config", default=None, type=str, help=argparse.SUPPRESS)
    return parser
