"""Forward+backward time and extra peak memory of per-position cross entropy on CPU.

Variants (each in a fresh process, see _measure.py for how memory is measured):
  mpu      the upstream composition written as plain autograd: max, subtract, exp, sum,
           log, gather (what mpu.vocab_parallel_cross_entropy computes on one rank)
  torch    torch.nn.functional.cross_entropy(reduction="none"), for context
  shim     shim.nn.functional.sparse_softmax_cross_entropy

The loss is reduced as GLM does, sum(loss * loss_mask) / loss_mask.sum(). Half/bf16
logits are widened with .float() first for mpu and torch, as upstream does; shim takes
them as they are. "extra peak" is measured after the inputs exist, so it includes the
logits' gradient, which every variant must produce; "saved MiB" is what the forward keeps
alive for backward, inputs included.

    python -m bench.cross_entropy                       # N=4096, V=50304, fp32
    python -m bench.cross_entropy --dtype bfloat16 --repeats 3
"""

from __future__ import annotations

import argparse
import json


from bench._measure import measure_step, print_cpu_line, print_table, run_agreeing_variants, saved_for_backward_mib

VARIANTS = ("mpu", "torch", "shim")


def mpu_formula(logits, labels):
    logits = logits.float()
    shifted = logits - logits.max(dim=-1, keepdim=True).values
    sum_exp = shifted.exp().sum(dim=-1)
    return sum_exp.log() - shifted.gather(-1, labels[:, None]).squeeze(-1)


def torch_cross_entropy(logits, labels):
    import torch.nn.functional as F

    return F.cross_entropy(logits.float(), labels, reduction="none")


def shim_cross_entropy(logits, labels):
    import shim.nn.functional as F

    return F.sparse_softmax_cross_entropy(logits, labels)


def worker(variant: str, args) -> dict:
    import torch

    loss_fn = {"mpu": mpu_formula, "torch": torch_cross_entropy, "shim": shim_cross_entropy}[variant]
    generator = torch.Generator().manual_seed(0)
    dtype = getattr(torch, args.dtype)
    # made in its dtype directly: a wider temporary would raise the RSS high-water mark
    logits = torch.randn(args.rows, args.vocab, generator=generator, dtype=dtype).requires_grad_()
    labels = torch.randint(0, args.vocab, (args.rows,), generator=generator)
    loss_mask = (torch.rand(args.rows, generator=generator) < 0.9).float()

    def step():
        logits.grad = None
        loss = loss_fn(logits, labels)
        reduced = (loss * loss_mask).sum() / loss_mask.sum()
        reduced.backward()
        return reduced.item()

    result = measure_step(step, args.repeats)
    return {**result, "saved_mib": saved_for_backward_mib(lambda: loss_fn(logits, labels))}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4096, help="positions N (batch * sequence), default 4096")
    parser.add_argument("--vocab", type=int, default=50304, help="vocabulary size V, default 50304")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--repeats", type=int, default=5, help="timed forward+backward steps per variant")
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        print(json.dumps(worker(args.worker, args)))
        return

    print_cpu_line()
    forwarded = ["--rows", str(args.rows), "--vocab", str(args.vocab), "--dtype", args.dtype, "--repeats", str(args.repeats)]
    rows, loss = run_agreeing_variants(__spec__.name, VARIANTS, forwarded)
    print(f"N={args.rows} V={args.vocab} {args.dtype}, forward+backward, loss {loss:.4f}")
    print_table(rows, reference="mpu")


if __name__ == "__main__":
    main()
