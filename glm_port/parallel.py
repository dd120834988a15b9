"""Where a GLM run's ranks sit and how GLM's layers split over them (one place, so model.py reads as the math).

``ParallelEnv`` reads the launcher's environment (``torchrun``: RANK, WORLD_SIZE, LOCAL_RANK), starts
the process group and lays the ranks out with shim's mesh (``setup_dist_util``): tensor-parallel
neighbours adjacent, data parallel across. In one process with no launcher nothing is started.

``TensorParallel`` builds the layers. With one rank every method is the plain layer or the identity.
"""

from __future__ import annotations

import contextlib
import os

import shim as torch
import shim.distributed as dist
import shim.nn as nn
import shim.nn.functional as F


class TensorParallel:
    """Builds GLM's linear layers and embedding for ``size`` tensor-parallel ranks."""

    def __init__(self, size: int = 1, rank: int = 0, group=None):
        self.size, self.rank, self.group = size, rank, group

    def divide(self, n: int, what: str) -> int:
        if n % self.size:
            raise ValueError(f"{n} {what} do not split over tensor-parallel size {self.size}")
        return n // self.size

    def _linear(self, in_features, out_features, init):
        layer = nn.Linear(in_features, out_features)
        init(layer.weight)
        nn.init.zeros_(layer.bias)
        return layer

    def column_linear(self, in_features, out_features, init):
        return self._linear(in_features, out_features, init)

    def row_linear(self, in_features, out_features, init):
        return self._linear(in_features, out_features, init)

    def vocab_embedding(self, vocab_size, hidden_size, init):
        embedding = nn.Embedding(vocab_size, hidden_size)
        init(embedding.weight)
        return embedding

    def column_matmul(self, layer, x):
        """``x @ W.T`` without the bias (the caller fuses it with the next op)."""
        return F.linear(x, layer.weight)

    def row_matmul(self, layer, x):
        return F.linear(x, layer.weight)

    def copy_to_parallel(self, x):
        return x

    def rng_fork(self):
        return contextlib.nullcontext()


class ParallelEnv:
    """The ranks of one run: device, data-parallel and tensor-parallel groups."""

    def __init__(self, device, tp_size=1, tp_rank=0, tp_group=None, dp_size=1, dp_rank=0, dp_group=None,
                 owns_process_group=False):
        self.device = device
        self.tp_size, self.tp_rank, self.tp_group = tp_size, tp_rank, tp_group
        self.dp_size, self.dp_rank, self.dp_group = dp_size, dp_rank, dp_group
        self._owns_process_group = owns_process_group

    @classmethod
    def from_environment(cls, tensor_parallel_size: int = 1, backend: str | None = None, device: str | None = None):
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if world_size % tensor_parallel_size:
            raise ValueError(
                f"--model-parallel-size {tensor_parallel_size} does not divide the {world_size} processes "
                f"(launch with torchrun --nproc_per_node N, N a multiple of it)"
            )
        device = torch.device(device) if device else torch.device()
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if world_size == 1:
            return cls(device)
        started = not dist.is_initialized()
        if started:
            dist.init_process_group(backend or ("nccl" if device.type == "cuda" else "gloo"))
        layout = dist.setup_dist_util(tensor_parallel_size=tensor_parallel_size)
        return cls(
            device,
            tp_size=tensor_parallel_size, tp_rank=layout.tensor_parallel_rank,
            tp_group=layout.tensor_parallel_mesh.get_group(),
            dp_size=layout.data_parallel_size, dp_rank=layout.data_parallel_rank,
            dp_group=layout.data_parallel_mesh.get_group(),
            owns_process_group=started,
        )

    @property
    def is_main(self) -> bool:
        return dist.get_rank() == 0

    def tensor_parallel(self) -> TensorParallel:
        return TensorParallel(self.tp_size, self.tp_rank, self.tp_group)

    def seed_tracker(self, seed: int) -> None:
        if self.tp_size > 1:
            torch.checkpointing.model_parallel_cuda_manual_seed(seed)

    def wrap_data_parallel(self, model):
        if self.dp_size == 1:
            return model
        return dist.DistributedDataParallel(model, process_group=self.dp_group)

    def clip_grad_norm(self, parameters, max_norm: float):
        return torch.nn.utils.clip_grad_norm_(parameters, max_norm)

    def local_state_dict(self, model) -> dict:
        """This rank's weights under upstream's names (its shard under tensor parallel)."""
        return model.state_dict()

    def close(self) -> None:
        if self._owns_process_group:
            dist.destroy_process_group()
