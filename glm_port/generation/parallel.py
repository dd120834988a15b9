"""Where an inference run's ranks sit: LiBai's four numbers on shim's layout.

``torchrun --nproc_per_node N -m glm_port.generate --tensor-parallel-size T --pipeline-parallel-size P``:
shim's ``setup_layout`` lays the N ranks out as (pipeline, data, tensor) with D = N / (T * P); the
model's layers are built split over the T tensor-parallel ranks and each rank reads its own slices of the
weights (for ChatGLM2, T may exceed its key/value groups when it is a multiple of them: each group is then
held by T / groups ranks); with P > 1 each rank builds and reads only its stage's layers (split over the stage's T ranks). Every rank of a tensor-parallel group runs the same search on the same (gathered) logits, so
they pick the same tokens; sampling uses one seed, broadcast from rank 0. Data parallel splits the
prompts: rank group d takes prompts d, d + D, ...; global rank 0 gathers and writes the results.
"""

from __future__ import annotations

import os

import shim as torch
import shim.distributed as dist
from glm_port.distributed import ModelParallel  # noqa: F401  (the loaders' argument; importers name it here too)


class InferenceParallel:
    def __init__(self, device, layout=None, owns_process_group=False):
        self.device = device
        self.layout = layout
        self._owns = owns_process_group

    @classmethod
    def from_environment(cls, tensor_parallel_size=1, pipeline_parallel_size=1, pipeline_num_layers=None,
                         device=None) -> "InferenceParallel":
        world = int(os.environ.get("WORLD_SIZE", "1"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        if device is None:
            device = f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu"
        device = torch.device(device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        model_parallel = tensor_parallel_size * pipeline_parallel_size
        if world % model_parallel:
            raise ValueError(f"--tensor-parallel-size {tensor_parallel_size} x --pipeline-parallel-size "
                             f"{pipeline_parallel_size} does not divide the {world} processes (launch with "
                             f"torchrun --nproc_per_node a multiple of {model_parallel})")
        if world == 1:
            return cls(device)
        started = not dist.is_initialized()
        if started:
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
        layout = dist.setup_layout(tensor_parallel_size=tensor_parallel_size,
                                      pipeline_parallel_size=pipeline_parallel_size,
                                      pipeline_num_layers=pipeline_num_layers)
        return cls(device, layout, started)

    @property
    def distributed(self) -> bool:
        return self.layout is not None

    def model_parallel(self) -> ModelParallel | None:
        if not self.distributed:
            return None
        layout = self.layout
        if layout.pipeline_parallel_size > 1:
            from glm_port.distributed import PipelineStage

            return ModelParallel(layout.tensor_parallel_size, layout.tensor_parallel_rank, PipelineStage(layout))
        if layout.tensor_parallel_size == 1:
            return None
        return ModelParallel(layout.tensor_parallel_size, layout.tensor_parallel_rank)

    def seed(self, seed: int | None) -> None:
        """One seed on every rank (rank 0's when none is given), so sampling agrees across the group."""
        if self.distributed and seed is None:
            chosen = [int(torch.randint(0, 2**31 - 1, ()).item())]
            dist.broadcast_object_list(chosen, src=0)
            seed = chosen[0]
        if seed is not None:
            torch.manual_seed(seed)

    def my_prompts(self, count: int) -> range:
        """Indices of the prompts this rank's data-parallel group generates for."""
        if not self.distributed:
            return range(count)
        return range(self.layout.data_parallel_rank, count, self.layout.data_parallel_size)

    def gather_results(self, results: list[tuple[int, dict]]) -> list[dict]:
        """``(prompt index, result)`` of every data-parallel group, in the prompts' order."""
        if self.distributed and self.layout.data_parallel_size * self.layout.pipeline_parallel_size > 1:
            gathered = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, results)
            # One copy per data-parallel group: its tensor-parallel rank 0.
            groups = [gathered[int(self.layout.mesh.mesh[0, d, 0])] for d in range(self.layout.data_parallel_size)]
            results = [item for group in groups for item in group]
        return [result for _, result in sorted(results, key=lambda item: (item[0], item[1].get("sequence", 0)))]

    @property
    def is_writer(self) -> bool:
        return not self.distributed or dist.get_rank() == 0

    def close(self) -> None:
        if self.distributed:
            dist.reset_dist_util()
            if self._owns:
                dist.destroy_process_group()
