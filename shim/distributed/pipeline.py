"""Pipeline parallelism: a layer's stage (from ``setup_layout``) runs through torch.distributed.pipelining.

Splitting layers over pipeline stages has no DTensor form, so each rank
builds only the layers of its own stage (``stage_layers()``) and hands that
module to ``pipeline_schedule``, which wraps it as a ``PipelineStage`` on the
layout's ``pp`` group and returns torch's schedule. Then, as in torch::

    schedule.step(x)                          # first stage
    schedule.step(target=y, losses=losses)    # last stage
    schedule.step()                           # stages in between
"""

from __future__ import annotations

from torch import nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

from shim._device import active_device
from shim.distributed.layout import get_layout

__all__ = ["pipeline_schedule", "stage_layers"]

SCHEDULES = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}


def stage_layers(stage: int | None = None) -> range:
    """The layer indices ``[0, pipeline_num_layers)`` that ``stage`` (default: this rank's) holds."""
    layout = get_layout()
    return layout.stage_layers(layout.pipeline_stage if stage is None else stage)


def pipeline_schedule(stage_module: nn.Module, n_microbatches: int, loss_fn=None, *, schedule: str = "1f1b"):
    """Torch's ``schedule`` ("1f1b" or "gpipe") running ``stage_module`` as this rank's pipeline stage.

    ``loss_fn(output, target)`` is used on the last stage; the batch given to
    ``step`` is split into ``n_microbatches`` along dim 0, and gradients are
    averaged over the microbatches.
    """
    if schedule not in SCHEDULES:
        raise ValueError(f"pipeline_schedule(schedule={schedule!r}): expected one of {sorted(SCHEDULES)}")
    layout = get_layout()
    if n_microbatches < layout.pipeline_parallel_size and schedule == "1f1b":
        raise ValueError(
            f"1F1B needs at least as many microbatches ({n_microbatches}) as stages ({layout.pipeline_parallel_size})"
        )
    stage = PipelineStage(
        stage_module,
        stage_index=layout.pipeline_stage,
        num_stages=layout.pipeline_parallel_size,
        device=active_device(),
        group=layout.pipeline_mesh.get_group(),
    )
    return SCHEDULES[schedule](stage, n_microbatches=n_microbatches, loss_fn=loss_fn)
