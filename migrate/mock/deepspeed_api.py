"""The two DeepSpeed start-up calls GLM makes, for when DeepSpeed is not installed.

``deepspeed.init_distributed`` and ``deepspeed.add_config_arguments`` have no
shim name of their own (the codemod leaves them to DeepSpeed), so the stand-in
``deepspeed`` module serves these, built on ``shim.distributed``.
"""

from __future__ import annotations

import argparse
import os


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
    import shim.distributed as dist

    if dist_init_required is False or dist.is_initialized():
        return
    import torch

    backend = dist_backend or ("nccl" if torch.cuda.is_available() else "gloo")
    kwargs = {} if timeout is None else {"timeout": timeout}
    launched = init_method is not None or "RANK" in os.environ or rank >= 0
    if launched:
        os.environ.setdefault("MASTER_PORT", str(distributed_port))
        kwargs.update(init_method=init_method or "env://", rank=rank, world_size=world_size)
    else:
        kwargs.update(store=dist.HashStore(), rank=0, world_size=1)
    if verbose:
        print(f"glm-mock: initializing torch.distributed ({backend}) for deepspeed.init_distributed", flush=True)
    dist.init_process_group(backend=backend, **kwargs)


def add_config_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The flags DeepSpeed adds to a training script's parser, same names and defaults."""
    group = parser.add_argument_group("DeepSpeed", "DeepSpeed configurations")
    group.add_argument(
        "--deepspeed",
        default=False,
        action="store_true",
        help="enable DeepSpeed (needs the real DeepSpeed: glm-mock does not provide its engine)",
    )
    group.add_argument("--deepspeed_config", default=None, type=str, help="DeepSpeed json configuration file")
    group.add_argument("--deepscale", default=False, action="store_true", help=argparse.SUPPRESS)
    group.add_argument("--deepscale_config", default=None, type=str, help=argparse.SUPPRESS)
    return parser
