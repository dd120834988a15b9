"""What activation checkpointing saves and costs in glm-pretrain's training step.

    python -m bench.checkpointing                                        # CPU: base, fp32
    python -m bench.checkpointing --shapes large --bf16 --batch-size 16  # on a GPU

Three policies, glm-pretrain's flags in brackets: **none**; **full** (``--checkpoint-activations``):
each layer keeps only its input and recomputes everything in backward; **selective**
(``--checkpoint-policy selective``): each layer also keeps the outputs of its matmuls and recomputes
the rest (LayerNorms, GELU, dropout masks, residual adds, attention: every op that draws random numbers
runs again, SDPA's kernels included, so the dropout masks replay in order). The step is glm-pretrain's (row 6 of
bench/pretrain_levers.py), on the same real batches for every policy.

Peak memory is that of the tensors alive during one step (parameters, gradients, optimizer state,
activations): ``torch.cuda.max_memory_allocated`` on a GPU, torch's ``MemTracker`` (which follows
every tensor storage) on CPU, where no allocator keeps the count. It is measured in a step of its
own, as the tracker slows the step it watches.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import statistics

from tqdm import tqdm

import shim as torch
from bench._measure import print_cpu_line
from bench.pretrain import SHAPES, add_data_arguments, resolve_data
from bench.pretrain_levers import STEPS, prepare, shape_setup, step, step_setup, time_levers

POLICIES = {
    "none": {},
    "full": {"checkpoint_activations": True},
    "selective": {"checkpoint_activations": True, "checkpoint_policy": "selective"},
}
GLM_PRETRAIN_LEVERS = STEPS[-1][1]


def peak_step_memory(config, batch, device, dtype) -> int:
    """Bytes of tensors alive at the peak of one training step, after one step to create the state."""
    model, optimizer, precision = prepare(config, GLM_PRETRAIN_LEVERS, device, dtype)
    step(model, batch, optimizer, precision, GLM_PRETRAIN_LEVERS)
    if device.type == "cuda":
        gc.collect()  # nothing of the policies measured before may count here
        torch.cuda.empty_cache()
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        step(model, batch, optimizer, precision, GLM_PRETRAIN_LEVERS)
        return torch.cuda.max_memory_allocated(device)
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(model, optimizer)
    with tracker:
        step(model, batch, optimizer, precision, GLM_PRETRAIN_LEVERS)
    return int(sum(peaks["Total"] for peaks in tracker.get_tracker_snapshot("peak").values()))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=["base"])
    parser.add_argument("--batch-size", type=int, help="override the shapes' (first) batch size")
    parser.add_argument("--policies", nargs="+", choices=list(POLICIES), default=list(POLICIES),
                        help="the policies to measure (default all); ratios are against the first one")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per policy and round (default 4)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed steps first (default 1)")
    parser.add_argument("--rounds", type=int, default=1, help="alternating repetitions (default 1)")
    parser.add_argument("--bf16", action="store_true", help="bf16 autocast (the GPU configuration)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads on CPU (default 1)")
    add_data_arguments(parser)
    args = parser.parse_args(argv)
    resolve_data(parser, args)

    print_cpu_line()
    device, dtype, tokenizer = step_setup(args)
    for name in args.shapes:
        shape, batch_size, config, batches = shape_setup(name, args, tokenizer, device)
        policies = list(dict.fromkeys(args.policies))
        seconds = {policy: [] for policy in policies}
        jobs = [policies[(i + r) % len(policies)] for r in range(args.rounds) for i in range(len(policies))]
        for policy in tqdm(jobs, desc=name, unit="run", leave=False):
            median, _ = time_levers(config.replace(**POLICIES[policy]), itertools.cycle(batches),
                                    GLM_PRETRAIN_LEVERS, device, dtype, args.steps, args.warmup)  # fmt: skip
            seconds[policy].append(median)
        memory = {policy: peak_step_memory(config.replace(**POLICIES[policy]), batches[0], device, dtype)
                  for policy in tqdm(policies, desc=f"{name} memory", leave=False)}  # fmt: skip
        print(f"\n{name}: {shape.layers} layers, hidden {shape.hidden}, seq {shape.seq}, batch {batch_size}")
        print(f"| checkpointing | ms/step | step time vs {policies[0]} | peak tensor MiB | memory vs {policies[0]} |\n"
              f"| --- | --- | --- | --- | --- |")
        base_time, base_memory = statistics.median(seconds[policies[0]]), memory[policies[0]]
        for policy in policies:
            s = statistics.median(seconds[policy])
            print(f"| {policy} | {s * 1e3:.1f} | {s / base_time:.2f}x | {memory[policy] / 2**20:.0f} | "
                  f"{memory[policy] / base_memory:.2f}x |")


if __name__ == "__main__":
    main()
