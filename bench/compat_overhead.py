"""What shim.compat costs per call, against the TorchFunctionMode design it did not take.

shim.compat wraps torch's ~40 factories and ``.to``/``.new_*``/``.cuda``; a TorchFunctionMode that
rewrites ``device=`` (how ``torch.set_default_device`` works) would instead sit in front of every
torch call. This times a few calls (small tensors, so the Python overhead shows) three ways: plain
torch, under ``shim.compat.install()``, and under such a mode.

    python -m bench.compat_overhead [--threads 1] [--rounds 3]
"""

from __future__ import annotations

import argparse
import contextlib

import torch
import torch.utils.benchmark as benchmark
from torch.overrides import TorchFunctionMode

import shim.compat
from bench._measure import print_cpu_line
from shim.compat.devices import means_cuda


class DeviceRewriteMode(TorchFunctionMode):
    """The alternative: rewrite CUDA ``device=`` keywords on every torch call."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if means_cuda(kwargs.get("device")):
            kwargs["device"] = torch.device("cpu")
        return func(*args, **kwargs)


CALLS = {
    "a + b (no device)": "a + b",
    "torch.matmul(a, b)": "torch.matmul(a, b)",
    "torch.zeros(16)": "torch.zeros(16)",
    "a.to(torch.float64)": "a.to(torch.float64)",
    "a.new_zeros(16)": "a.new_zeros(16)",
}


def time_us(stmt: str, threads: int) -> float:
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    timer = benchmark.Timer(stmt, globals={"torch": torch, "a": a, "b": b}, num_threads=threads)
    # the fastest block: on a shared machine the median mostly measures other processes
    return min(timer.blocked_autorange(min_run_time=0.5).times) * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print_cpu_line()
    torch.set_num_threads(args.threads)

    configurations = {"torch": contextlib.nullcontext, "compat": shim.compat.installed, "mode": DeviceRewriteMode}
    best = {(name, config): float("inf") for name in CALLS for config in configurations}
    for _ in range(args.rounds):  # interleaved rounds, best of each: load from other processes comes and goes
        for config, context in configurations.items():
            with context():
                for name, stmt in CALLS.items():
                    best[name, config] = min(best[name, config], time_us(stmt, args.threads))
    with shim.compat.installed():
        compat_cuda = time_us("torch.zeros(16, device='cuda')", args.threads)

    print(f"{'call':<24} {'torch us':>9} {'compat us':>10} {'mode us':>8}  (fastest block)")
    for name in CALLS:
        plain, compat, mode = (best[name, config] for config in configurations)
        print(f"{name:<24} {plain:9.2f} {compat:10.2f} {mode:8.2f}")
    print(f"{'zeros(device=cuda)':<24} {'error':>9} {compat_cuda:10.2f}")


if __name__ == "__main__":
    main()
