"""FusedAdam's kernel choice: torch's fused Adam against its foreach and per-tensor paths.

shim.optim.FusedAdam passes ``fused=True`` where torch has a fused kernel for every parameter; this
shows what that buys over torch's default (foreach) on the parameter set of a GLM-shaped
transformer (per layer: QKV, attention dense, h->4h, 4h->h weights and biases, two layer norms).

    python -m bench.optim_fused [--hidden 512] [--layers 4] [--threads 2]
"""

from __future__ import annotations

import argparse

import torch
import torch.utils.benchmark as benchmark

from bench._measure import print_cpu_line
from shim.optim import FusedAdam


def glm_layer_params(hidden: int, layers: int) -> list[torch.Tensor]:
    shapes = []
    for _ in range(layers):
        shapes += [(hidden,), (hidden,), (3 * hidden, hidden), (3 * hidden,), (hidden, hidden), (hidden,)]
        shapes += [(hidden,), (hidden,), (4 * hidden, hidden), (4 * hidden,), (hidden, 4 * hidden), (hidden,)]
    generator = torch.Generator().manual_seed(0)
    params = [torch.randn(s, generator=generator).requires_grad_() for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape, generator=generator)
    return params


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2, help="torch intra-op threads")
    args = parser.parse_args()
    print_cpu_line()
    torch.set_num_threads(args.threads)

    variants = {
        "shim FusedAdam": lambda ps: FusedAdam(ps, lr=1e-4, weight_decay=0.01),
        "AdamW fused": lambda ps: torch.optim.AdamW(ps, lr=1e-4, weight_decay=0.01, fused=True),
        "AdamW foreach (default)": lambda ps: torch.optim.AdamW(ps, lr=1e-4, weight_decay=0.01, foreach=True),
        "AdamW for-loop": lambda ps: torch.optim.AdamW(ps, lr=1e-4, weight_decay=0.01, foreach=False),
    }
    params = glm_layer_params(args.hidden, args.layers)
    count = sum(p.numel() for p in params)
    print(f"{len(params)} tensors, {count / 1e6:.1f} M parameters, {args.threads} threads, device cpu")
    results = {}
    for name, make in variants.items():
        optimizer = make(params)
        optimizer.step()  # create the state outside the timing
        timer = benchmark.Timer("optimizer.step()", globals={"optimizer": optimizer}, num_threads=args.threads)
        results[name] = timer.blocked_autorange(min_run_time=2.0).median * 1e3
    reference = results["AdamW foreach (default)"]
    for name, ms in results.items():
        print(f"{name:<26} {ms:8.2f} ms/step   {reference / ms:5.2f}x vs foreach")


if __name__ == "__main__":
    main()
