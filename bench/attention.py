"""Attention with GLM's sep mask and attention dropout, forward+backward, on CPU: what the CPU kernel buys.

  sdpa-nodrop  torch's scaled_dot_product_attention, boolean mask, dropout 0 (its fused CPU kernel):
               the floor, not the same math
  explicit     upstream GLM's formula: scores*mask - 65504*(1-mask), softmax, F.dropout, @ v
  sdpa         scaled_dot_product_attention with dropout_p (on CPU: its math path)
  fused        shim.nn.functional.fused_masked_attention (blocks of heads, keep_mask)
  mask-bernoulli / mask-keep_mask   the dropout mask alone, [b, n, s, s]: bernoulli_ vs keep_mask
  apply-masked_fill / apply-multiply  applying it to one block of scores (one sample's heads):
               masked_fill_ with the bool mask vs apply_keep (a multiplication by its bytes)

Each variant runs in a fresh process (see _measure.py); speedups are against ``sdpa``.

    python -m bench.attention                                      # GLM base layer: b8, 8 heads, s256, d32
    python -m bench.attention --batch 4 --heads 16 --seq 512 --head-dim 64   # GLM-Large layer
    python -m bench.attention --block-elements 65536 524288 4194304          # the fused kernel's block size
"""

from __future__ import annotations

import argparse
import json

from bench._measure import measure_step, print_cpu_line, print_table, run_worker, saved_for_backward_mib
from tqdm import tqdm

ATTENTION = ("sdpa-nodrop", "explicit", "sdpa", "fused")
MASKS = ("mask-bernoulli", "mask-keep_mask", "apply-masked_fill", "apply-multiply")


def worker(variant: str, args) -> dict:
    import torch

    import shim.nn.functional as F
    from glm_port.models.glm.attention import masked_attention, visibility_mask
    from shim.ops.dropout_mask import apply_keep, keep_mask

    torch.set_num_threads(args.threads)
    generator = torch.Generator().manual_seed(0)
    shape = (args.batch, args.heads, args.seq, args.head_dim)
    q, k, v = (torch.randn(*shape, generator=generator).requires_grad_() for _ in range(3))
    grad = torch.randn(*shape, generator=generator)
    sep = torch.randint(args.seq // 4, args.seq, (args.batch,), generator=generator)
    visible = visibility_mask(sep, args.batch, args.seq)
    mask_shape = (args.batch, args.heads, args.seq, args.seq)

    forwards = {
        "sdpa-nodrop": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=visible),
        "explicit": lambda: masked_attention(q, k, v, visible, args.p),
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=visible, dropout_p=args.p),
        "fused": lambda: F.fused_masked_attention(q, k, v, visible, args.p, block_elements=args.block),
    }
    if variant in MASKS:
        scores = torch.rand(mask_shape[1:], generator=generator)  # one sample's heads: the kernel's block
        keep = keep_mask(scores.shape, args.p)
        steps = {
            "mask-bernoulli": lambda: torch.empty(mask_shape, dtype=torch.bool).bernoulli_(args.p),
            "mask-keep_mask": lambda: keep_mask(mask_shape, args.p),
            "apply-masked_fill": lambda: scores.masked_fill_(~keep, 0.0),
            "apply-multiply": lambda: apply_keep(scores, keep),
        }

        def step():
            steps[variant]()
            return 0.0

        return {**measure_step(step, args.repeats), "saved_mib": 0.0}

    forward = forwards[variant]

    def step():
        torch.manual_seed(0)
        q.grad = k.grad = v.grad = None
        out = forward()
        out.backward(grad)
        return out.detach().sum().item()

    return {**measure_step(step, args.repeats), "saved_mib": saved_for_backward_mib(forward)}


def main(argv=None) -> None:
    from shim.ops.attention import BLOCK_ELEMENTS

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--p", type=float, default=0.1, help="attention dropout, default 0.1 (upstream's)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads, default 1 (as bench/pretrain.py)")
    parser.add_argument("--repeats", type=int, default=15, help="timed steps per variant")
    parser.add_argument("--block-elements", type=int, nargs="+", default=[BLOCK_ELEMENTS],
                        help=f"the fused kernel's scores per block; several values add a row each (default {BLOCK_ELEMENTS})")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--block", type=int, default=BLOCK_ELEMENTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        print(json.dumps(worker(args.worker, args)))
        return

    print_cpu_line()
    forwarded = [f"--{name}={getattr(args, name.replace('-', '_'))}"
                 for name in ("batch", "heads", "seq", "head-dim", "p", "threads", "repeats")]
    # (row label, worker variant, extra flags): one "fused" row per block size asked for
    jobs = [(v, v, []) for v in ATTENTION if v != "fused"]
    jobs += [("fused" if len(args.block_elements) == 1 else f"fused-{b}", "fused", [f"--block={b}"])
             for b in args.block_elements]
    jobs += [(v, v, []) for v in MASKS]
    rows = [{"variant": label, **run_worker(__spec__.name, variant, forwarded + extra)}
            for label, variant, extra in tqdm(jobs, desc="variants", leave=False)]
    print(f"\nattention [b {args.batch}, heads {args.heads}, seq {args.seq}, d {args.head_dim}] fp32, "
          f"dropout {args.p}, {args.threads} thread(s), forward+backward")
    print_table([r for r in rows if r["variant"].split("-")[0] not in ("mask", "apply")], reference="sdpa")
    print("\ndropout mask alone")
    print_table([r for r in rows if r["variant"].startswith("mask-")], reference="mask-bernoulli")
    print("\napplying it to one block of scores")
    print_table([r for r in rows if r["variant"].startswith("apply-")], reference="apply-masked_fill")


if __name__ == "__main__":
    main()
