"""One training step and what it needs: optimizer, learning-rate schedule, loss, precision.

Numerics are upstream's: AdamW math (apex FusedAdam's ``adam_w_mode``), no weight decay on biases and
LayerNorm, AnnealingLR's warmup and decay, gradient clipping by global norm, and the loss
``sum(loss * loss_mask) / loss_mask.sum()``. Data parallel divides by the mask sum of the *global*
batch, so N ranks at batch b compute exactly what one process computes at batch N*b.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
from tqdm import tqdm

import shim as torch
import shim.distributed as dist
import shim.nn.functional as F
from glm_port.data._renamed import renamed
from glm_port.distributed import ParallelEnv
from glm_port.sharding import as_root_forward

DECAY_STYLES = ("constant", "linear", "cosine", "exponential")


def annealing_lr(warmup_iters: float, decay_iters: int, style: str, decay_ratio: float):
    """Upstream AnnealingLR as a multiplier of the base lr for ``torch.optim.lr_scheduler.LambdaLR``.

    Linear warmup over ``warmup_iters``, then decay over the remaining ``decay_iters - warmup_iters``
    down to ``decay_ratio`` of the base lr, held there afterwards. Upstream leaves "exponential" as a
    TODO (constant); here it is ``decay_ratio ** progress``.
    """
    if style not in DECAY_STYLES:
        raise ValueError(f"unknown lr decay style {style!r}; choose from {', '.join(DECAY_STYLES)}")
    decay_span = max(decay_iters - warmup_iters, 1)

    def multiplier(step: int) -> float:
        if warmup_iters > 0 and step <= warmup_iters:
            return step / warmup_iters
        progress = min((step - warmup_iters) / decay_span, 1.0)
        if style == "linear":
            return 1.0 - (1.0 - decay_ratio) * progress
        if style == "cosine":
            return decay_ratio + (1.0 - decay_ratio) * (math.cos(math.pi * progress) + 1.0) / 2.0
        if style == "exponential":
            return decay_ratio**progress
        return 1.0

    return multiplier


@dataclass(frozen=True)
class OptimizerSettings:
    lr: float = 1e-4
    weight_decay: float = 0.01
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    warmup: float = 0.01  # fraction of the decay iterations
    decay_iters: int = 1
    decay_style: str = "linear"
    decay_ratio: float = 0.1


def weight_decay_param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """Upstream's grouping: no weight decay on biases and normalisation weights (the 1-D parameters)."""
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (no_decay if param.dim() < 2 else decay).append(param)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def build_optimizer(model, settings: OptimizerSettings):
    """AdamW (fused kernel where torch has one) + AnnealingLR, with upstream's parameter groups."""
    groups = weight_decay_param_groups(model, settings.weight_decay)
    groups = [g for g in groups if g["params"]]
    # The fused kernel needs every parameter on one device type with a floating dtype; plain
    # tensors qualify (CPU and CUDA), and so do DTensors all on one mesh (FSDP2's shards, glm_port.sharding:
    # the fused op runs on each local shard); a mix (tensor parallel's DTensors beside plain
    # tensors) goes the foreach way.
    params = [p for g in groups for p in g["params"]]
    meshes = {getattr(p, "device_mesh", None) for p in params}
    fused = all(type(p) is torch.nn.Parameter for p in params) or (None not in meshes and len(meshes) == 1)
    optimizer = torch.optim.AdamW(groups, lr=settings.lr, betas=settings.betas, eps=settings.eps, fused=fused or None)
    warmup_iters = settings.warmup * settings.decay_iters
    schedule = annealing_lr(warmup_iters, settings.decay_iters, settings.decay_style, settings.decay_ratio)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)


class Precision:
    """fp32, bf16 autocast, or fp16 autocast with loss scaling: dynamic (upstream's default for --fp16:
    start at 2**32, halve on overflow, double after ``window`` clean steps) or static (``--loss-scale``: never
    grows; unlike upstream, a step with inf/NaN gradients is still skipped and halves it).

    Dynamic scaling also takes upstream's ``--hysteresis`` (overflows tolerated before the scale halves, the
    count restored when the scale grows) and ``--min-scale`` (a floor), which torch's GradScaler lacks: after
    its update, the scale it lowered is put back (while hysteresis lasts) or raised to the floor.
    """

    def __init__(self, device: torch.device, dtype: torch.dtype = torch.float32, loss_scale: float | None = None,
                 *, window: int = 1000, hysteresis: int = 1, min_scale: float = 1.0, init_scale: float = 2.0**32):
        self.device, self.dtype = device, dtype
        self.dynamic = loss_scale is None
        self.hysteresis, self.min_scale = max(int(hysteresis), 1), min_scale
        self._tolerated = self.hysteresis
        self.scaler = torch.amp.GradScaler(
            device.type, init_scale=loss_scale or init_scale,
            growth_interval=int(window) if self.dynamic else 2**31 - 1, enabled=dtype == torch.float16,
        )

    def autocast(self):
        if self.dtype == torch.float32:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype)

    @property
    def loss_scale(self) -> float | None:
        return self.scaler.get_scale() if self.scaler.is_enabled() else None

    def update(self) -> bool:
        """``scaler.update()`` with hysteresis and the floor; True when this step overflowed (was skipped)."""
        if not self.scaler.is_enabled():
            return False
        before = self.scaler.get_scale()
        self.scaler.update()
        after = self.scaler.get_scale()
        if after < before and self.dynamic:
            if self._tolerated > 1:
                self._tolerated -= 1
                self.scaler.update(before)
            elif after < self.min_scale:
                self.scaler.update(self.min_scale)
        elif after > before:
            self._tolerated = self.hysteresis
        return after < before

def _sum_over(group, *values: torch.Tensor) -> list[torch.Tensor]:
    """All-reduce (sum) scalars over the data-parallel group in one collective."""
    packed = torch.stack([v.detach().float() for v in values])
    if group is not None and dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(packed, group=group)
    return list(packed.unbind())


def positions_logits(model, batch: dict, counted) -> torch.Tensor:
    """The batch layout every glm_port trainer uses (``text``, ``position_id``, ``attention_mask``,
    ``target``, ``loss_mask``) fed to a model that takes ``logit_positions`` (GLM's): logits ``[n, V]``
    of the ``counted`` positions only. A family whose model takes other inputs passes its own function
    with this signature as ``logits_fn``."""
    return model(batch["text"], batch["position_id"], batch["attention_mask"], logit_positions=counted)[0]


def lm_loss(model, batch: dict, dp_group=None, dp_size: int = 1, parallel_group=None, label_smoothing: float = 0.0,
            logits_fn=positions_logits):
    """Forward one batch; returns ``(loss_to_backprop, global_loss_value)``.

    ``global_loss_value`` = sum(loss * mask) / mask.sum() over the whole data-parallel batch.
    ``loss_to_backprop`` is scaled so that DDP's gradient *mean* over ``dp_size`` ranks equals the
    gradient of that global loss.
    """
    # Positions with a zero mask add nothing to the loss nor to any gradient: project only the others.
    # Their indices are found once, before the forward (on a GPU, one host sync while the queue is short).
    counted = (batch["loss_mask"] != 0).nonzero(as_tuple=True)
    logits = logits_fn(model, batch, counted)
    if label_smoothing:  # torch's cross entropy (one device: the vocab-parallel op has no smoothing)
        losses = F.cross_entropy(logits.float(), batch["target"][counted], reduction="none",
                                 label_smoothing=label_smoothing)
    else:
        losses = F.sparse_softmax_cross_entropy(logits, batch["target"][counted], process_group=parallel_group)
    loss_mask = batch["loss_mask"][counted].to(losses.dtype)
    local_sum = (losses * loss_mask).sum()
    global_sum, global_count = _sum_over(dp_group, local_sum, loss_mask.sum())
    denominator = global_count.clamp(min=1.0)  # upstream: divide only when the mask is not empty
    return local_sum * dp_size / denominator, global_sum / denominator


def train_step(model, microbatches, optimizer, scheduler, precision: Precision, *, clip_grad: float = 1.0,
               env: ParallelEnv | None = None, label_smoothing: float = 0.0, stats: dict | None = None,
               logits_fn=positions_logits, as_tensor: bool = False):
    """Accumulate gradients over ``microbatches``, clip, step; returns the mean global loss: a float, or with
    ``as_tensor`` a float64 tensor on the device holding the same value, read without waiting for the device
    (what ``TrainingLoop`` takes, so a GPU step has no host synchronisation for its loss).

    ``stats``, when given, receives ``grad_norm`` (the global norm before clipping, measured even with
    ``clip_grad`` 0) and ``skipped`` (an fp16 overflow skipped the step)."""
    env = env or ParallelEnv(precision.device)
    logits_fn = as_root_forward(model, logits_fn)  # sharded (FSDP2): the logits as a forward of the root
    # A new step for layers compiled as CUDA graphs (mode reduce-overhead): last step's graph outputs may be
    # reused. Nothing else notices it.
    torch.compiler.cudagraph_mark_step_begin()
    optimizer.zero_grad(set_to_none=True)
    total = torch.zeros((), dtype=torch.float64, device=precision.device) if as_tensor else 0.0
    for i, batch in enumerate(microbatches):
        # Only the last micro-batch all-reduces gradients under DDP.
        sync = i == len(microbatches) - 1 or not hasattr(model, "no_sync")
        if hasattr(model, "set_requires_gradient_sync"):  # FSDP2: reduce-scatter after the last one only
            model.set_requires_gradient_sync(i == len(microbatches) - 1)
        with contextlib.nullcontext() if sync else model.no_sync():
            with precision.autocast():
                loss, value = lm_loss(model, batch, env.dp_group, env.dp_size, env.tp_group, label_smoothing,
                                      logits_fn)
            precision.scaler.scale(loss / len(microbatches)).backward()
        # float64 either way: the tensor sum is the float sum, operation for operation
        total = total + (value.detach().double() if as_tensor else value.item()) / len(microbatches)
    env.sync_gradients(model.parameters())
    if clip_grad > 0 or stats is not None:
        precision.scaler.unscale_(optimizer)
        norm = env.clip_grad_norm(model.parameters(), clip_grad if clip_grad > 0 else math.inf)
        if stats is not None:
            stats["grad_norm"] = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    precision.scaler.step(optimizer)
    skipped = precision.update()
    if not skipped:  # as upstream: an overflow-skipped step leaves the lr alone
        scheduler.step()
    if stats is not None:
        stats["skipped"] = skipped
    return total


def log_line(iteration: int, total: int, ms_per_iter: float, lr: float, loss: float, loss_scale=None) -> str:
    """Upstream's ``report_iteration_metrics`` line, character for character."""
    line = f" iteration {iteration:8d}/{total:8d} |"
    line += f" elapsed time per iteration (ms): {ms_per_iter:.1f} |"
    line += f" learning rate {lr:.3E} |"
    line += f" lm loss {loss:.6E} |"
    if loss_scale is not None:
        line += f" loss scale {loss_scale:.1f} |"
    return line


def _to_device(batch: dict, device) -> dict:
    return {key: value.to(device, non_blocking=True) for key, value in batch.items()}


@dataclass
class TrainingLoop:
    """The loop every training command shares (glm-pretrain, glm-finetune): ``accumulation`` micro-batches
    a step through ``train_step``, upstream's log line every ``log_interval`` steps (a tqdm bar with loss,
    tokens/s and ETA on a terminal), and ``periodic`` callbacks ``(interval, fn(iteration))`` after the
    steps they fall on (saving, evaluation)."""

    model: torch.nn.Module  # as trained: wrapped for data parallel where it is
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    precision: Precision
    env: ParallelEnv
    total_iters: int
    accumulation: int = 1
    clip_grad: float = 1.0
    log_interval: int = 100
    tokens_per_iter: int | None = None  # for the bar's tokens/s
    label_smoothing: float = 0.0
    logits_fn: Callable = positions_logits  # how the model maps a batch to its counted positions' logits
    # Called on the main rank at each log line with ``(iteration, scalars)``: lr, train_loss, elapsed_time
    # (ms per iteration), grad_norm, tokens_per_second and, under fp16, loss_scale (e.g. for TensorBoard).
    summary: Callable[[int, dict], None] | None = None
    # Set: the first step's time is printed on the main rank, with this note (e.g. what compiles in it).
    first_step_note: str | None = None

    def run(self, batches: Iterator[dict], iteration: int,
            periodic: list[tuple[int, Callable[[int], None]]] = ()) -> int:
        """Train from ``iteration`` to ``total_iters``; returns the last iteration reached."""
        env = self.env
        self.model.train()
        bar = tqdm(total=self.total_iters, initial=iteration, unit="it", dynamic_ncols=True,
                   disable=not (env.is_main and sys.stderr.isatty()))
        interval_loss, interval_norm, interval_start = 0.0, 0.0, time.perf_counter()
        stats = {} if self.summary is not None else None
        first_step = self.first_step_note is not None and env.is_main
        try:
            while iteration < self.total_iters:
                step_start = time.perf_counter()
                microbatches = [_to_device(next(batches), env.device) for _ in range(self.accumulation)]
                loss = train_step(self.model, microbatches, self.optimizer, self.scheduler, self.precision,
                                  clip_grad=self.clip_grad, env=env, label_smoothing=self.label_smoothing,
                                  stats=stats, logits_fn=self.logits_fn, as_tensor=True)
                iteration += 1
                if first_step:
                    first_step = False
                    note = f"first iteration: {time.perf_counter() - step_start:.1f} s ({self.first_step_note})"
                    if bar.disable:
                        print(f" > {note}", flush=True)
                    else:
                        bar.write(f" > {note}")
                interval_loss = interval_loss + loss  # on the device: read at the log line, not every step
                interval_norm += stats["grad_norm"] if stats is not None else 0.0
                bar.update()
                if not bar.disable:  # a terminal's bar shows each step's loss (and waits for it)
                    postfix = {"loss": f"{float(loss):.4f}"}
                    if self.tokens_per_iter:
                        postfix["tok_s"] = f"{self.tokens_per_iter / (time.perf_counter() - step_start):.0f}"
                    bar.set_postfix(postfix)
                if iteration % self.log_interval == 0:
                    interval_loss = float(interval_loss)  # waits for the interval's steps, then times them
                    elapsed_ms = (time.perf_counter() - interval_start) * 1000.0 / self.log_interval
                    lr = self.optimizer.param_groups[0]["lr"]
                    if env.is_main:
                        line = log_line(iteration, self.total_iters, elapsed_ms, lr,
                                        interval_loss / self.log_interval, self.precision.loss_scale)
                        if bar.disable:
                            print(line, flush=True)
                        else:
                            bar.write(line)
                        if self.summary is not None:
                            scalars = {"lr": lr, "train_loss": interval_loss / self.log_interval,
                                       "elapsed_time": elapsed_ms, "grad_norm": interval_norm / self.log_interval}
                            if self.tokens_per_iter:
                                scalars["tokens_per_second"] = self.tokens_per_iter * 1000.0 / elapsed_ms
                            if self.precision.loss_scale is not None:
                                scalars["loss_scale"] = self.precision.loss_scale
                            self.summary(iteration, scalars)
                    interval_loss, interval_norm, interval_start = 0.0, 0.0, time.perf_counter()
                for interval, callback in periodic:
                    if interval and iteration % interval == 0:
                        callback(iteration)
        finally:
            bar.close()
        return iteration


@dataclass
class Encoded:
    """One sample in the trainers' batch layout (a family's ``encode`` makes them)."""

    text: np.ndarray  # [a + n]
    position_id: np.ndarray  # [2, a + n]
    sep: int  # a: Part A's length
    target: np.ndarray  # [a + n]
    loss_mask: np.ndarray  # [a + n]
    truncated_target: bool


def pad_batch(samples: list[Encoded], pad_id: int) -> dict[str, torch.Tensor]:
    """A batch in the trainers' keys (``text``, ``position_id``, ``attention_mask`` = sep, ``target``,
    ``loss_mask``), each sample padded at its end; padding is never attended to by counted positions
    and carries no loss."""
    length = max(len(s.text) for s in samples)

    def pad(array, value=0):
        widths = [(0, 0)] * (array.ndim - 1) + [(0, length - array.shape[-1])]
        return np.pad(array, widths, constant_values=value)

    return {
        "text": torch.from_numpy(np.stack([pad(s.text, pad_id) for s in samples])),
        "position_id": torch.from_numpy(np.stack([pad(s.position_id) for s in samples])),
        "attention_mask": torch.tensor([s.sep for s in samples], dtype=torch.long),
        "target": torch.from_numpy(np.stack([pad(s.target) for s in samples])),
        "loss_mask": torch.from_numpy(np.stack([pad(s.loss_mask) for s in samples])),
    }


def left_padded(prompts, pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Prompts (id sequences) as ``tokenizer(...)`` gives a batch to ``generate``: ``input_ids`` padded on
    the left with ``pad_id``, and the ``attention_mask`` marking the real tokens."""
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt):] = torch.as_tensor(prompt, dtype=torch.long)
        mask[row, width - len(prompt):] = 1
    return ids, mask


__getattr__ = renamed(__name__, {"collate": "pad_batch"}, globals())  # the name before issue 27
