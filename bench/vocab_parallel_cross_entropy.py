"""Vocab-parallel cross entropy on two gloo ranks: forward+backward time and extra peak memory per rank.

Each rank holds half the vocabulary of the logits. Variants (each a fresh pair of processes; see
_measure.py for how memory is measured):
  composed       the textbook formula in plain autograd with autograd-aware all-reduces
                 (torch.distributed.nn.functional): max, subtract, exp, sum, log, gather
  loss_parallel  torch's own: F.cross_entropy on a vocab-sharded DTensor under loss_parallel()
  shim           shim.ops.vocab_parallel_cross_entropy (two all-reduces, one logits-sized
                 buffer in backward)

The loss is reduced as GLM does, sum(loss * loss_mask) / loss_mask.sum(). Half/bf16 logits
are widened with .float() first for composed and loss_parallel, as upstream does; shim takes
them as they are. Rank 0's numbers are reported (the ranks are symmetric).

    python -m bench.vocab_parallel_cross_entropy                     # N=2048, V=50304, fp32
    python -m bench.vocab_parallel_cross_entropy --dtype bfloat16 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os


from bench._measure import measure_step, print_cpu_line, print_table, run_agreeing_variants

VARIANTS = ("composed", "loss_parallel", "shim")


def composed(local_logits, labels, group):
    import torch
    import torch.distributed as dist
    from torch.distributed.nn.functional import all_reduce

    logits = local_logits.float()
    local_vocab = logits.shape[-1]
    start = dist.get_rank(group) * local_vocab
    global_max = logits.detach().amax(dim=-1)
    dist.all_reduce(global_max, op=dist.ReduceOp.MAX, group=group)
    shifted = logits - global_max[:, None]
    sum_exp = all_reduce(shifted.exp().sum(dim=-1), group=group)
    here = (labels >= start) & (labels < start + local_vocab)
    local_labels = torch.where(here, labels - start, 0)
    target = all_reduce(shifted.gather(-1, local_labels[:, None]).squeeze(-1) * here, group=group)
    return sum_exp.log() - target


def torch_loss_parallel(local_logits, labels, group):
    import torch.nn.functional as F
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor import DTensor, Shard
    
    mesh = DeviceMesh.from_group(group, "cpu")
    sharded = DTensor.from_local(local_logits.float(), mesh, [Shard(1)], run_check=False)
    return F.cross_entropy(sharded, labels, reduction="none").full_tensor()


def shim_vocab_parallel(local_logits, labels, group):
    from shim.ops.vocab_parallel_cross_entropy import vocab_parallel_sparse_softmax_cross_entropy

    return vocab_parallel_sparse_softmax_cross_entropy(local_logits, labels, group)


def rank_worker(rank: int, variant: str, args, port: int, result_path: str) -> None:
    import contextlib

    import torch
    import torch.distributed as dist
    from torch.distributed.tensor.parallel import loss_parallel

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    group = dist.group.WORLD
    loss_fn = {"composed": composed, "loss_parallel": torch_loss_parallel, "shim": shim_vocab_parallel}[variant]
    shared = torch.Generator().manual_seed(0)  # labels and mask: the same on both ranks
    labels = torch.randint(0, args.vocab, (args.rows,), generator=shared)
    loss_mask = (torch.rand(args.rows, generator=shared) < 0.9).float()
    # Only this rank's vocab half is ever allocated: a freed whole-vocab tensor would
    # raise the RSS high-water mark the extra peak is measured from.
    own = torch.Generator().manual_seed(1 + rank)
    local_logits = torch.randn(args.rows, args.vocab // 2, generator=own, dtype=getattr(torch, args.dtype))
    local_logits.requires_grad_()

    # torch's loss parallelism needs forward and backward inside its context manager
    context = loss_parallel if variant == "loss_parallel" else contextlib.nullcontext

    def step():
        local_logits.grad = None
        with context():
            loss = loss_fn(local_logits, labels, group)
            reduced = (loss * loss_mask).sum() / loss_mask.sum()
            reduced.backward()
        return reduced.item()

    result = measure_step(step, args.repeats)
    dist.destroy_process_group()
    if rank == 0:
        with open(result_path, "w") as f:
            json.dump(result, f)


def worker(variant: str, args) -> dict:
    import tempfile

    import torch.multiprocessing as mp

    from harness import free_port

    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        result_path = os.path.join(tmp, "rank0.json")
        mp.spawn(rank_worker, args=(variant, args, port, result_path), nprocs=2)
        with open(result_path) as f:
            return json.load(f)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=2048, help="positions N (batch * sequence), default 2048")
    parser.add_argument("--vocab", type=int, default=50304, help="global vocabulary size V (even), default 50304")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--repeats", type=int, default=5, help="timed forward+backward steps per variant")
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.vocab % 2:
        parser.error(f"--vocab {args.vocab} must be even: it is split over two ranks")

    if args.worker:
        print(json.dumps(worker(args.worker, args)))
        return

    print_cpu_line()
    forwarded = ["--rows", str(args.rows), "--vocab", str(args.vocab), "--dtype", args.dtype, "--repeats", str(args.repeats)]
    rows, loss = run_agreeing_variants(__spec__.name, VARIANTS, forwarded)
    print(f"2 ranks, N={args.rows} V={args.vocab} ({args.vocab // 2} per rank) {args.dtype}, "
          f"forward+backward, loss {loss:.4f}; rank 0's numbers")
    print_table(rows, reference="composed")


if __name__ == "__main__":
    main()
