"""Where a run's ranks sit: device, data-parallel and tensor-parallel groups (any model family).

``ParallelEnv`` reads the launcher's environment (``torchrun``: RANK, WORLD_SIZE, LOCAL_RANK), starts
the process group and lays the ranks out with shim's mesh (``setup_layout``): tensor-parallel
neighbours adjacent, data parallel across. In one process with no launcher nothing is started.

Models declare how their layers split (shim's ``Linear1D`` / ``VocabParallelEmbedding``); the layout
set up here is what turns those layers into shards when the model is built after it.
"""

from __future__ import annotations

import dataclasses
import os

import shim as torch
import shim.distributed as dist


def local_state_dict(model) -> dict:
    """The model's weights as this rank holds them: upstream's ``mp_rank_XX`` layout."""
    return {name: torch.to_local(value) for name, value in model.state_dict().items()}


def tensor_parallel_size() -> int:
    """How many ranks models built now split their layers over (1 before a layout is set up)."""
    layout = dist.current_layout()
    return 1 if layout is None else layout.tensor_parallel_size


@dataclasses.dataclass(frozen=True)
class ModelParallel:
    """What a family's loader needs to know: this rank's place in the tensor-parallel group, and its
    pipeline stage (``PipelineStage``) when the layers are split into stages."""

    size: int
    rank: int
    pipeline: object = None


def current_model_parallel() -> ModelParallel | None:
    """This rank's tensor-parallel place under the layout set up now (``ParallelEnv``), for a loader that
    reads its slices; None with no layout or a tensor-parallel size of 1."""
    layout = dist.current_layout()
    if layout is None or layout.tensor_parallel_size == 1:
        return None
    return ModelParallel(layout.tensor_parallel_size, layout.tensor_parallel_rank)


class ParallelEnv:
    """The ranks of one run: device, data-parallel and tensor-parallel groups."""

    def __init__(self, device, tp_size=1, tp_rank=0, tp_group=None, dp_size=1, dp_rank=0, dp_group=None,
                 owns_process_group=False, sharding=None):
        self.device = device
        self.tp_size, self.tp_rank, self.tp_group = tp_size, tp_rank, tp_group
        self.dp_size, self.dp_rank, self.dp_group = dp_size, dp_rank, dp_group
        self._owns_process_group = owns_process_group
        # glm_port.sharding.Sharding: FSDP2 over the data-parallel ranks (None: plain DDP / one process)
        self.sharding = sharding

    @classmethod
    def from_environment(cls, tensor_parallel_size: int = 1, backend: str | None = None, device: str | None = None,
                         sharding_stage: int = 0, sharding_degree: int | None = None):
        """``sharding_stage`` 1-3 (0: off) shards parameters, gradients and optimizer state over
        ``sharding_degree`` data-parallel ranks (None: all of them) with FSDP2 (``glm_port.sharding``); with
        ``tensor_parallel_size`` > 1 over the dp dimension of the (dp, tp) mesh, every data-parallel rank."""
        from glm_port.sharding import Sharding, fsdp_mesh, resolve_degree

        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        if world_size % tensor_parallel_size:
            raise ValueError(
                f"--model-parallel-size {tensor_parallel_size} does not divide the {world_size} processes "
                f"(launch with torchrun --nproc_per_node N, N a multiple of it)"
            )
        degree = resolve_degree(sharding_stage, sharding_degree, world_size, tensor_parallel_size)
        if sharding_stage and tensor_parallel_size > 1 and degree != world_size // tensor_parallel_size:
            raise ValueError(f"--sharding_degree {degree} with tensor parallel {tensor_parallel_size} is not "
                             "supported: under tensor parallel shard over every data-parallel rank (leave "
                             "--sharding_degree out)")
        device = torch.device(device) if device else torch.device()
        if device.type == "cuda":
            torch.cuda.set_device(device)
        if world_size == 1:
            return cls(device)
        started = not dist.is_initialized()
        if started:
            dist.init_process_group(backend or ("nccl" if device.type == "cuda" else "gloo"))
        layout = dist.setup_layout(tensor_parallel_size=tensor_parallel_size)
        sharding = Sharding(sharding_stage, degree, fsdp_mesh(layout, degree)) if sharding_stage else None
        return cls(
            device,
            tp_size=tensor_parallel_size, tp_rank=layout.tensor_parallel_rank,
            tp_group=layout.tensor_parallel_mesh.get_group(),
            dp_size=layout.data_parallel_size, dp_rank=layout.data_parallel_rank,
            dp_group=layout.data_parallel_mesh.get_group(),
            owns_process_group=started, sharding=sharding,
        )

    @property
    def is_main(self) -> bool:
        return dist.get_rank() == 0

    def seed_tracker(self, seed: int) -> None:
        if self.tp_size > 1:
            torch.recompute.model_parallel_cuda_manual_seed(seed)

    @property
    def _syncs_gradients_itself(self) -> bool:
        # torch's DDP cannot bucket DTensor parameters, so with tensor parallel the data-parallel
        # all-reduce is done here, once per step, on each rank's shards (under sharding FSDP2 reduce-scatters).
        return self.dp_size > 1 and self.tp_size > 1 and self.sharding is None

    def shard(self, model, compute_dtype=None):
        """Under sharding: ``fully_shard`` the model in place (before its optimizer is built: the parameters
        become DTensor shards); ``compute_dtype`` bf16 computes in bf16 on fp32 masters. Else the model."""
        if self.sharding is None:
            return model
        from glm_port.sharding import shard_model

        return shard_model(model, self.sharding, compute_dtype)

    def wrap_data_parallel(self, model):
        if self.dp_size == 1 or self._syncs_gradients_itself or self.sharding is not None:
            return model  # FSDP2 reduce-scatters the gradients itself
        return dist.DistributedDataParallel(model, process_group=self.dp_group)

    def sync_gradients(self, parameters) -> None:
        """Average gradients over the data-parallel ranks when DDP does not (see above)."""
        if not self._syncs_gradients_itself:
            return
        grads = [torch.to_local(p.grad) for p in parameters if p.grad is not None]
        dist.all_reduce_flat(grads, group=self.dp_group, average=True)  # one collective for the whole model

    def clip_grad_norm(self, parameters, max_norm: float):
        """Clip by the norm of the whole model's gradient, shards counted once."""
        parameters = [p for p in parameters if p.grad is not None]
        if self.sharding is not None:
            from glm_port.sharding import clip_grad_norm

            return clip_grad_norm(parameters, max_norm)
        if self.tp_size == 1:
            return torch.nn.utils.clip_grad_norm_(parameters, max_norm)
        from shim import mpu  # Megatron's clip: shards summed over the tensor-parallel group

        return mpu.clip_grad_norm(parameters, max_norm)

    def close(self) -> None:
        if self._owns_process_group:
            dist.destroy_process_group()


class PipelineStage:
    """This rank's stage of an inference pipeline (shim's layout, ``pipeline_parallel_size > 1``).

    Stages run in lockstep: stage s receives the hidden states of stage s - 1, runs its layers
    (``layers``, a range of global layer indices, as ``ParallelLayout.stage_layers`` splits them) and sends
    them on; the last stage's output (the logits) is broadcast to every stage, so each rank sees the same
    logits and takes the same search steps.
    """

    def __init__(self, layout, num_layers: int | None = None):
        """``num_layers``: the model's layers, when the layout was set up before they were known."""
        if num_layers is not None and num_layers != layout.pipeline_num_layers:
            layout = dataclasses.replace(layout, pipeline_num_layers=num_layers)
        self.layout = layout
        self.stage = layout.pipeline_stage
        self.stages = layout.pipeline_parallel_size
        self.layers = layout.stage_layers(self.stage)
        self.group = layout.pipeline_mesh.get_group()
        dp, tp = layout.data_parallel_rank, layout.tensor_parallel_rank
        self._rank_of = [int(layout.mesh.mesh[s, dp, tp]) for s in range(self.stages)]

    @property
    def is_first(self) -> bool:
        return self.stage == 0

    @property
    def is_last(self) -> bool:
        return self.stage == self.stages - 1

    def holds(self, layer_idx: int) -> bool:
        """Whether this stage runs layer ``layer_idx`` (the model's index, as the split layers carry it)."""
        return layer_idx in self.layers

    def send_forward(self, tensor) -> None:
        dist.send(tensor.contiguous(), self._rank_of[self.stage + 1], group=self.group)

    def recv_forward(self, shape, dtype, device):
        tensor = torch.empty(shape, dtype=dtype, device=device)
        dist.recv(tensor, self._rank_of[self.stage - 1], group=self.group)
        return tensor

    def broadcast_from_last(self, tensor):
        dist.broadcast(tensor, self._rank_of[-1], group=self.group)
        return tensor
