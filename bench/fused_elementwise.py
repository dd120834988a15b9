"""Forward+backward time and extra peak memory of the fused elementwise ops on CPU.

  gelu     bias add + tanh GELU on the MLP activation [tokens, 4 * hidden]:
           composed torch.nn.functional.gelu(x + bias, approximate="tanh")
           vs shim.nn.functional.fused_bias_add_gelu
  dropout  bias add + dropout + residual on the hidden state [tokens, hidden]:
           composed torch.nn.functional.dropout(x + bias, p) + residual
           vs shim.nn.functional.fused_bias_add_dropout

Each variant runs in a fresh process (see _measure.py for how memory is measured); "extra
peak" includes the input gradients every variant must produce; "saved MiB" is what the
forward keeps alive for backward, inputs included (held per layer until backward).

    python -m bench.fused_elementwise                    # tokens 8192 (16 x 512), hidden 1024
"""

from __future__ import annotations

import argparse
import json

from tqdm import tqdm

from bench._measure import measure_step, print_cpu_line, print_table, run_worker, saved_for_backward_mib

VARIANTS = ("gelu-composed", "gelu-fused", "dropout-composed", "dropout-fused")


def worker(variant: str, args) -> dict:
    import torch

    import shim.nn.functional as F

    op, kind = variant.split("-")
    width = 4 * args.hidden if op == "gelu" else args.hidden
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(args.tokens, width, generator=generator).requires_grad_()
    bias = torch.randn(width, generator=generator).requires_grad_()
    residual = torch.randn(args.tokens, width, generator=generator).requires_grad_()
    grad = torch.randn(args.tokens, width, generator=generator)

    if variant == "gelu-composed":
        def forward():
            return torch.nn.functional.gelu(x + bias, approximate="tanh")
    elif variant == "gelu-fused":
        def forward():
            return F.fused_bias_add_gelu(x, bias)
    elif variant == "dropout-composed":
        def forward():
            return torch.nn.functional.dropout(x + bias, args.p) + residual
    else:
        def forward():
            return F.fused_bias_add_dropout(x, bias, args.p, residual=residual)

    def step():
        torch.manual_seed(0)
        x.grad = bias.grad = residual.grad = None
        out = forward()
        out.backward(grad)
        return out.detach().sum().item()

    result = measure_step(step, args.repeats)
    return {**result, "saved_mib": saved_for_backward_mib(forward)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=8192, help="batch * sequence, default 8192 (16 x 512)")
    parser.add_argument("--hidden", type=int, default=1024, help="hidden size (GELU runs on 4x this), default 1024")
    parser.add_argument("--p", type=float, default=0.1, help="dropout probability, default 0.1")
    parser.add_argument("--repeats", type=int, default=20, help="timed forward+backward steps per variant")
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)

    if args.worker:
        print(json.dumps(worker(args.worker, args)))
        return

    print_cpu_line()
    forwarded = ["--tokens", str(args.tokens), "--hidden", str(args.hidden), "--p", str(args.p)]
    forwarded += ["--repeats", str(args.repeats)]
    rows = [{"variant": v, **run_worker(__spec__.name, v, forwarded)} for v in tqdm(VARIANTS, desc="variants", leave=False)]
    for op, shape in (("gelu", f"[{args.tokens}, {4 * args.hidden}]"), ("dropout", f"[{args.tokens}, {args.hidden}]")):
        print(f"\n{op} on {shape} fp32, forward+backward")
        print_table([r for r in rows if r["variant"].startswith(op)], reference=f"{op}-composed")


if __name__ == "__main__":
    main()
