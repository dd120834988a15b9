"""Where a GLM run's ranks sit and how GLM's layers split over them (one place, so model.py reads as the math).

``ParallelEnv`` reads the launcher's environment (``torchrun``: RANK, WORLD_SIZE, LOCAL_RANK), starts
the process group and lays the ranks out with shim's mesh (``setup_dist_util``): tensor-parallel
neighbours adjacent, data parallel across. In one process with no launcher nothing is started.

``TensorParallel`` builds the layers. With one rank every method is the plain layer or the identity.
"""

from __future__ import annotations

import contextlib
import os
import sys

import shim as torch
import shim.distributed as dist
import shim.nn as nn
import shim.nn.functional as F


def _is_dtensor(tensor) -> bool:
    # DTensor takes seconds to import; before it is imported no tensor can be one.
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(tensor, module.DTensor)


def _local(tensor):
    """This rank's part of a parameter, gradient or output (the tensor itself when not sharded)."""
    return tensor.to_local() if _is_dtensor(tensor) else tensor


def local_state_dict(model) -> dict:
    """The model's weights as this rank holds them: upstream's ``mp_rank_XX`` layout."""
    return {name: _local(value) for name, value in model.state_dict().items()}


class TensorParallel:
    """Builds GLM's linear layers and embedding for ``size`` tensor-parallel ranks.

    Layers are shim's ``Linear1D`` / ``VocabParallelEmbedding`` (DTensor shards on the mesh's ``tp``
    dim), initialised whole from the same seed as one process, so a tensor-parallel run starts from
    the very weights a single process would. The matmuls whose bias is fused into the next op go
    through DTensor here; the rest is the layers' own forward.
    """

    def __init__(self, size: int = 1, rank: int = 0, group=None):
        self.size, self.rank, self.group = size, rank, group

    def divide(self, n: int, what: str) -> int:
        if n % self.size:
            raise ValueError(f"{n} {what} do not split over tensor-parallel size {self.size}")
        return n // self.size

    def _plain_linear(self, in_features, out_features, init):
        layer = nn.Linear(in_features, out_features)
        init(layer.weight)
        nn.init.zeros_(layer.bias)
        return layer

    def column_linear(self, in_features, out_features, init, thirds: bool = False):
        """``in -> out`` split by output rows. ``thirds``: a fused Q|K|V weight, split per third as
        Megatron does, so that each rank's shard is ``[Q_r; K_r; V_r]`` (upstream's mp_rank layout)."""
        if self.size == 1:
            return self._plain_linear(in_features, out_features, init)
        return nn.Linear1D(in_features, out_features, parallel="col", init_method=init, stride=3 if thirds else 1)

    def row_linear(self, in_features, out_features, init):
        if self.size == 1:
            return self._plain_linear(in_features, out_features, init)
        return nn.Linear1D(in_features, out_features, parallel="row", init_method=init)

    def vocab_embedding(self, vocab_size, hidden_size, init):
        self.divide(vocab_size, "vocabulary entries")
        if self.size == 1:
            embedding = nn.Embedding(vocab_size, hidden_size)
            init(embedding.weight)
            return embedding
        return nn.VocabParallelEmbedding(vocab_size, hidden_size, init_method=init)

    @staticmethod
    def local(tensor):
        return _local(tensor)

    def column_matmul(self, layer, x):
        """``x @ W.T`` without the bias (the caller fuses it with the next op): this rank's columns."""
        if self.size == 1:
            return F.linear(x, layer.weight)
        from shim.distributed.tensor import DTensor, Replicate

        mesh = layer.weight.device_mesh
        return F.linear(DTensor.from_local(x, mesh, [Replicate()], run_check=False), layer.weight).to_local()

    def row_matmul(self, layer, x):
        """``x @ W.T`` without the bias, summed over the ranks' input slices."""
        if self.size == 1:
            return F.linear(x, layer.weight)
        from shim.distributed.tensor import DTensor, Replicate, Shard

        mesh = layer.weight.device_mesh
        partial = F.linear(DTensor.from_local(x, mesh, [Shard(-1)], run_check=False), layer.weight)
        return partial.redistribute(mesh, [Replicate()]).to_local()

    def tied_logits(self, hidden, embedding):
        """Logits from the word-embedding table; vocab-sharded under tensor parallel (``parallel_output``)."""
        return self.column_matmul(embedding, hidden)

    def rng_fork(self):
        """Attention dropout draws from the per-rank stream, as Megatron's ``get_cuda_rng_tracker().fork()``."""
        if self.size == 1:
            return contextlib.nullcontext()
        return torch.checkpointing.get_cuda_rng_tracker().fork()


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

    @property
    def _syncs_gradients_itself(self) -> bool:
        # torch's DDP cannot bucket DTensor parameters, so with tensor parallel the data-parallel
        # all-reduce is done here, once per step, on each rank's shards.
        return self.dp_size > 1 and self.tp_size > 1

    def wrap_data_parallel(self, model):
        if self.dp_size == 1 or self._syncs_gradients_itself:
            return model
        return dist.DistributedDataParallel(model, process_group=self.dp_group)

    def sync_gradients(self, parameters) -> None:
        """Average gradients over the data-parallel ranks when DDP does not (see above)."""
        if not self._syncs_gradients_itself:
            return
        grads = [_local(p.grad) for p in parameters if p.grad is not None]
        flat = torch._utils._flatten_dense_tensors(grads)
        dist.all_reduce(flat, group=self.dp_group)
        flat /= self.dp_size
        for grad, synced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):
            grad.copy_(synced)

    def clip_grad_norm(self, parameters, max_norm: float):
        """Clip by the norm of the whole model's gradient, shards counted once."""
        parameters = [p for p in parameters if p.grad is not None]
        if self.tp_size == 1:
            return torch.nn.utils.clip_grad_norm_(parameters, max_norm)
        from shim import mpu  # Megatron's clip: shards summed over the tensor-parallel group

        return mpu.clip_grad_norm(parameters, max_norm)

    def close(self) -> None:
        if self._owns_process_group:
            dist.destroy_process_group()
