"""Per-rank memory of a full finetune step, one process against N ranks sharded with FSDP2 (``--sharding``).

    python -m bench.sharding_memory                          # 4096 wide (GLM-10B / ChatGLM-6B), 2 layers: 1 vs 2 ranks
    python -m bench.sharding_memory --ranks 1 2 4 --stage 2
    python -m bench.sharding_memory --layers 1 --vocab 8192 --ranks 1 4      # 1 vs 4 ranks in ~16 GiB
    python -m bench.sharding_memory --hidden 256 --heads 4 --vocab 1024 --ranks 1 2   # smoke run
    python -m bench.sharding_memory --load --layers 1 --vocab 8192 --ranks 1 4   # glm-finetune's load, 1 vs 4

Each world size runs in fresh forked processes on gloo (CPU), through the pieces glm-finetune runs: a
``GLMModel``, ``ParallelEnv.from_environment(sharding_stage=...)`` and ``env.shard`` (FSDP2 per layer + the
root, ``glm_port.sharding``), the shared ``build_optimizer`` (AdamW) and ``train_step`` (clipping included),
``--steps`` steps at ``--batch`` samples of ``--seq`` tokens per rank, the loss on the last half.

Per rank it reports, after the steps:

- the bytes of the tensors a rank holds for the model's state: parameters, gradients and AdamW's two
  moments (DTensor local shards; ``exp_avg`` + ``exp_avg_sq``), counted exactly;
- the process's peak resident set (``VmHWM``) and its rise over the interpreter with torch imported.

The sharded ranks build the model on the meta device and materialise only their shards (``to_empty``), as
FSDP2 intends for models larger than a rank; the one-process run builds it in memory.

``--load``: glm-finetune's own loading instead of training steps. A ChatGLM2 model of the shape asked
(ChatGLM2-6B's layout: 2 key/value groups, ``--ffn`` wide MLP, an untied output layer; ``--vocab`` rows) is
saved in ``--checkpoint-dtype`` (THUDM ships ChatGLM2-6B in fp16) to a temporary directory by a separate process, then every rank runs ``glm_port.finetune.run.setup``
of ``glm-finetune --model_name_or_path DIR --do_train --sharding stageN``: rank 0 reads the checkpoint, the
other ranks build the model on the meta device and receive their shards (``glm_port.sharding.shard_from_rank0``);
one process loads it whole. Reported per rank: the parameter bytes it ends with and the peak RSS rise over
the interpreter after loading and reading each parameter once (the load's peak, as a first step sees it: the
loaders may map the checkpoint's file, whose pages count once read).

The summary line: optimizer + gradient bytes per rank against 1/N of the one-process run's (goal: within
1.2x), and the peak RSS rise per rank likewise.

Before each world size its memory is estimated (``estimated_rank_bytes``: 1/N of 16 bytes a parameter, plus,
sharded, the root and one layer held whole with their gradients, and a fifth more) against MemAvailable: a world size that
would not fit in 90% of it is skipped with one line saying so (``--force`` runs it anyway), so 4 ranks of a
6B-wide model on a shared machine do not drive it out of memory.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint  # noqa: F401  (imported before the baseline RSS is read)
import torch.distributed.device_mesh  # noqa: F401
import torch.distributed.fsdp  # noqa: F401
import torch.distributed.tensor  # noqa: F401
import torch.multiprocessing as mp

from bench._measure import MIB, current_rss_bytes, peak_rss_bytes, print_cpu_line
from harness import free_port


def _config(args):
    from glm_port.models.glm import GLMConfig

    return GLMConfig(vocab_size=args.vocab, num_layers=args.layers, hidden_size=args.hidden,
                     num_attention_heads=args.heads, intermediate_size=args.ffn or 4 * args.hidden,
                     max_sequence_length=args.seq, embedding_dropout_prob=0.0, attention_dropout_prob=0.0,
                     output_dropout_prob=0.0)


def _batch(args, seed: int) -> dict:
    g = torch.Generator().manual_seed(seed)
    text = torch.randint(0, args.vocab, (args.batch, args.seq), generator=g)
    sep = torch.full((args.batch,), args.seq // 2)
    position = torch.arange(args.seq).expand(args.batch, args.seq)
    return {"text": text, "position_id": torch.stack([position.minimum(sep[:, None]),
                                                      (position - sep[:, None] + 1).clamp(min=0)], 1),
            "attention_mask": sep, "target": torch.roll(text, -1, 1),
            "loss_mask": (position >= sep[:, None]).long()}


def _local_bytes(tensors) -> int:
    from torch.distributed.tensor import DTensor

    return sum((t.to_local() if isinstance(t, DTensor) else t).nbytes for t in tensors if t is not None)


def _rank(rank: int, world: int, port: int, args, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world))
    torch.set_num_threads(args.threads)
    from glm_port.distributed import ParallelEnv
    from glm_port.models.glm import GLMModel
    from glm_port.training import OptimizerSettings, Precision, build_optimizer, train_step

    import_rss = current_rss_bytes()
    env = ParallelEnv.from_environment(sharding_stage=args.stage if world > 1 else 0)
    config = _config(args)
    if env.sharding is not None:  # meta, sharded, then only this rank's shards materialised
        with torch.device("meta"):
            model = GLMModel(config)
        model = env.shard(model)
        model.to_empty(device="cpu")
        with torch.no_grad():
            for param in model.parameters():
                param.to_local().normal_(0.0, 0.02)
    else:
        model = GLMModel(config)
    optimizer, scheduler = build_optimizer(model, OptimizerSettings(lr=1e-5, decay_iters=args.steps))
    precision = Precision(torch.device("cpu"))
    times = []
    for step in range(args.steps):
        start = time.perf_counter()
        loss = train_step(env.wrap_data_parallel(model), [_batch(args, step * world + rank)], optimizer, scheduler,
                          precision, clip_grad=1.0, env=env)
        times.append(time.perf_counter() - start)
    params = list(model.parameters())
    states = [optimizer.state[p][key] for p in params for key in ("exp_avg", "exp_avg_sq")]
    row = {"rank": rank, "world": world, "loss": loss, "step_s": min(times),
           "param_bytes": _local_bytes(params), "grad_bytes": _local_bytes([p.grad for p in params]),
           "optimizer_bytes": _local_bytes(states), "peak_rss": peak_rss_bytes(),
           "import_rss": import_rss, "whole_params": sum(p.numel() for p in params)}
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
        json.dump(row, f)
    env.close()


CHATGLM2_KV_GROUPS = 2  # ChatGLM2-6B's multi_query_group_num


def _chatglm2_overrides(args) -> dict:
    return dict(num_layers=args.layers, hidden_size=args.hidden, num_attention_heads=args.heads,
                kv_channels=args.hidden // args.heads, multi_query_group_num=CHATGLM2_KV_GROUPS,
                ffn_hidden_size=args.ffn or 4 * args.hidden, padded_vocab_size=args.vocab, seq_length=args.seq)


def _write_checkpoint(args, directory: str) -> None:
    """A random ChatGLM2 model of the bench's shape, saved as glm-finetune reads it (run in its own process)."""
    from pathlib import Path

    from glm_port.finetune.toy_task import write_toy_task
    from glm_port.models.chatglm2.finetune import save
    from glm_port.models.chatglm2.tiny import build_tiny

    torch.set_num_threads(args.threads)
    os.mkdir(os.path.join(directory, "tokenizer"))
    model, tokenizer = build_tiny(os.path.join(directory, "tokenizer"), **_chatglm2_overrides(args))
    save(model.to(getattr(torch, args.checkpoint_dtype)), tokenizer, os.path.join(directory, "base"))
    write_toy_task(Path(directory, "data"))


def _load_rank(rank: int, world: int, port: int, args, out_dir: str, directory: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world))
    torch.set_num_threads(args.threads)
    import contextlib
    import io

    import glm_port.models.chatglm2.finetune  # noqa: F401  (the modules loading imports, before the baseline)
    import glm_port.models.chatglm2.model  # noqa: F401
    import glm_port.models.chatglm2.weights  # noqa: F401
    from glm_port.finetune.run import parse_args, setup
    from glm_port.sharding import local_numel

    import_rss = current_rss_bytes()
    argv = ["--model_name_or_path", os.path.join(directory, "base"), "--do_train", "--train_file",
            os.path.join(directory, "data", "train.json"), "--sharding", f"stage{args.stage}",
            "--output_dir", os.path.join(out_dir, f"out{rank}")]
    with contextlib.redirect_stdout(io.StringIO()):
        session = setup(parse_args(argv))
    params = list(session.model.parameters())
    from torch.distributed.tensor import DTensor

    with torch.no_grad():  # every byte read once, as a step reads it (a memory-mapped checkpoint is paged in)
        for param in params:
            (param.to_local() if isinstance(param, DTensor) else param).sum()
    row = {"rank": rank, "world": world, "param_bytes": 4 * local_numel(params), "peak_rss": peak_rss_bytes(),
           "import_rss": import_rss, "whole_params": sum(p.numel() for p in params)}
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
        json.dump(row, f)
    session.env.close()


def measure_load(args, world: int, directory: str) -> list[dict]:
    with tempfile.TemporaryDirectory() as out_dir:
        context = mp.start_processes(_load_rank, args=(world, free_port(), args, out_dir, directory), nprocs=world,
                                     start_method="fork", join=False)
        while not context.join():
            pass
        return [json.load(open(os.path.join(out_dir, f"{r}.json"))) for r in range(world)]


def estimated_load_bytes(args, world: int, import_bytes: int = 400 * MIB) -> int:
    """What ``world`` ranks' loads need together, fp32: rank 0 (or the one process) the whole model twice (its
    read copy and the sharded or loaded one, checkpoint conversions included), each other rank its 1/N and the
    largest tensor in flight; each rank the interpreter."""
    from glm_port.models.chatglm2.config import ChatGLM2Config
    from glm_port.models.chatglm2.model import ChatGLM2ForCausalLM

    with torch.device("meta"):
        model = ChatGLM2ForCausalLM(ChatGLM2Config(**_chatglm2_overrides(args)))
    sizes = [p.numel() for p in model.parameters()]
    whole, largest = 4 * sum(sizes), 4 * max(sizes)
    return world * import_bytes + 2 * whole + (world - 1) * (whole // world + largest)


def main_load(args) -> None:
    print(f"glm-finetune's load: ChatGLM2 hidden {args.hidden}, {args.heads} heads ({CHATGLM2_KV_GROUPS} key/value "
          f"groups), ffn {args.ffn or 4 * args.hidden}, {args.layers} layers, vocabulary {args.vocab}; checkpoint in "
          f"{args.checkpoint_dtype}, loaded as fp32; sharded runs: --sharding stage{args.stage}", flush=True)
    print("| ranks | rank | params MiB | peak RSS MiB | RSS rise MiB |")
    print("| --- | --- | --- | --- | --- |")
    results = {}
    free, writing = available_bytes(), 3 * estimated_load_bytes(args, 1, 0) // 2
    if free is not None and writing > 0.9 * free and not args.force:
        print(f"the checkpoint: skipped: writing it would need about {writing / MIB:.0f} MiB, {free / MIB:.0f} MiB "
              "is available (fewer --layers, a smaller --vocab, or --force)", flush=True)
        return
    with tempfile.TemporaryDirectory() as directory:
        writer = mp.get_context("fork").Process(target=_write_checkpoint, args=(args, directory))
        writer.start()
        writer.join()
        if writer.exitcode:
            raise SystemExit(f"writing the checkpoint failed (exit status {writer.exitcode})")
        for world in args.ranks:
            need, free = estimated_load_bytes(args, world), available_bytes()
            if free is not None and need > 0.9 * free and not args.force:
                print(f"{world} ranks: skipped: they would need about {need / MIB:.0f} MiB, {free / MIB:.0f} MiB is "
                      "available (fewer --layers, a smaller --vocab, or --force)", flush=True)
                continue
            rows = results[world] = measure_load(args, world, directory)
            for row in rows:
                print(f"| {world} | {row['rank']} | {row['param_bytes'] / MIB:.0f} | {row['peak_rss'] / MIB:.0f} | "
                      f"{(row['peak_rss'] - row['import_rss']) / MIB:.0f} |", flush=True)
    if 1 in results:
        one = results[1][0]
        one_rise = one["peak_rss"] - one["import_rss"]
        print(f"parameters: {one['whole_params']:,}")
        for world, rows in results.items():
            if world == 1:
                continue
            rises = [r["peak_rss"] - r["import_rss"] for r in rows]
            others = max(rises[1:])
            print(f"{world} ranks: load's peak RSS rise: rank 0 {rises[0] / MIB:.0f} MiB = "
                  f"{rises[0] / one_rise:.2f} x one process's {one_rise / MIB:.0f} MiB; other ranks at most "
                  f"{others / MIB:.0f} MiB = {others / one_rise:.2f} x (1/{world} would be {1 / world:.2f})")


def _block_sizes(args) -> tuple[int, int, int]:
    """``(whole, largest layer, root)`` parameter counts of the bench's model, counted on the meta device."""
    from glm_port.models.glm import GLMModel
    from glm_port.sharding import transformer_layers

    with torch.device("meta"):
        model = GLMModel(_config(args))
    whole = sum(p.numel() for p in model.parameters())
    layers = transformer_layers(model)
    largest = max((sum(p.numel() for p in layer.parameters()) for layer in layers), default=0)
    return whole, largest, whole - sum(p.numel() for layer in layers for p in layer.parameters())


def estimated_rank_bytes(args, world: int, import_bytes: int = 400 * MIB) -> int:
    """A rank's expected peak resident set for ``world`` ranks: the interpreter with torch, its 1/N of the fp32
    parameters, gradients and AdamW's two moments (16 bytes a parameter), and, sharded, what FSDP2 holds
    whole at the peak of the backward: the root's parameters (embeddings; kept gathered after forward) and one
    gathered layer, each with its unsharded gradient (4 + 4 bytes a parameter); a fifth more for the rest."""
    whole, largest, root = _block_sizes(args)
    gathered = 0 if world == 1 else 8 * (largest + root)
    # x 1.2: the step's temporaries and what the allocator keeps (measured: 1.19x at 1 rank, 1.07x at 2)
    return import_bytes + int(1.2 * (16 * whole // world + gathered))


def available_bytes() -> int | None:
    """Linux's MemAvailable (None where /proc/meminfo does not say)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def measure(args, world: int) -> list[dict]:
    with tempfile.TemporaryDirectory() as out_dir:
        context = mp.start_processes(_rank, args=(world, free_port(), args, out_dir), nprocs=world,
                                     start_method="fork", join=False)
        while not context.join():
            pass
        return [json.load(open(os.path.join(out_dir, f"{r}.json"))) for r in range(world)]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.sharding_memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=4096)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--ffn", type=int, default=16384)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=50048)
    parser.add_argument("--seq", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1, help="samples per rank per step")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--stage", type=int, default=3, choices=(1, 2, 3))
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    parser.add_argument("--force", action="store_true",
                        help="run a world size whose estimated memory exceeds 90%% of what is available")
    parser.add_argument("--checkpoint-dtype", dest="checkpoint_dtype", default="float32",
                        choices=("float32", "bfloat16", "float16"),
                        help="--load: the dtype the checkpoint is saved in (loaded as fp32 master weights)")
    parser.add_argument("--load", action="store_true",
                        help="measure glm-finetune's loading (a ChatGLM2 checkpoint of this shape) instead of steps")
    args = parser.parse_args(argv)
    assert not dist.is_initialized()
    print_cpu_line()
    if args.load:
        return main_load(args)
    print(f"GLM hidden {args.hidden}, {args.heads} heads, ffn {args.ffn or 4 * args.hidden}, {args.layers} layers, "
          f"vocabulary {args.vocab}; batch {args.batch} x {args.seq} tokens per rank; fp32 AdamW; "
          f"sharded runs: --sharding stage{args.stage}", flush=True)
    print("| ranks | rank | params MiB | grads MiB | AdamW MiB | grads+AdamW MiB | peak RSS MiB | RSS rise MiB |"
          " step s |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    results = {}
    for world in args.ranks:
        need, free = world * estimated_rank_bytes(args, world), available_bytes()
        if free is not None and need > 0.9 * free and not args.force:  # the machine would swap or kill ranks
            print(f"{world} ranks: skipped: they would need about {need / MIB:.0f} MiB, {free / MIB:.0f} MiB is "
                  "available (fewer --layers, a smaller --vocab, or --force)", flush=True)
            continue
        rows = measure(args, world)
        results[world] = rows
        for row in rows:
            state = row["grad_bytes"] + row["optimizer_bytes"]
            print(f"| {world} | {row['rank']} | {row['param_bytes'] / MIB:.0f} | {row['grad_bytes'] / MIB:.0f} | "
                  f"{row['optimizer_bytes'] / MIB:.0f} | {state / MIB:.0f} | {row['peak_rss'] / MIB:.0f} | "
                  f"{(row['peak_rss'] - row['import_rss']) / MIB:.0f} | {row['step_s']:.2f} |", flush=True)
    if 1 in results:
        one = results[1][0]
        one_state = one["grad_bytes"] + one["optimizer_bytes"]
        one_rise = one["peak_rss"] - one["import_rss"]
        print(f"parameters: {one['whole_params']:,}")
        for world, rows in results.items():
            if world == 1:
                continue
            state = max(r["grad_bytes"] + r["optimizer_bytes"] for r in rows)
            rise = max(r["peak_rss"] - r["import_rss"] for r in rows)
            print(f"{world} ranks: grads+AdamW per rank {state / MIB:.0f} MiB = {state * world / one_state:.3f} x 1/{world} "
                  f"of one process's {one_state / MIB:.0f} MiB (goal <= 1.2); peak RSS rise per rank {rise / MIB:.0f} MiB "
                  f"= {rise * world / one_rise:.2f} x 1/{world} of one process's {one_rise / MIB:.0f} MiB")


if __name__ == "__main__":
    main()
