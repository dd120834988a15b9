"""Time and peak-memory measurement for the op benches: one fresh process per variant.

Why a process per variant: torch's CPU allocator hands large blocks straight to the OS
(glibc serves them with mmap and unmaps them on free), so the process's high-water RSS
(``peak_rss_bytes``: Linux's ``VmHWM``) records the true peak of what a step allocated. A fresh
process starts that high-water mark clean. The worker allocates and touches the inputs first,
reads the mark as the baseline, runs ONE step, and reports the mark minus the baseline as the
step's extra peak. Tensor memory torch's profiler would
report is not enough on its own: it misses what ATen kernels allocate outside tensors.
The timed repeats run afterwards, in the same worker, on warm code paths. Wall time
(median, min) is what a user waits; "cpu ms" is the process's CPU time per step (all
threads), which other processes on shared cores disturb less (speedup uses the median).
"""

from __future__ import annotations

import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from tqdm import tqdm

from bench.peak_memory import MIB, peak_rss_bytes  # noqa: F401 (the one implementation: peak_memory runs alone)

ROOT = Path(__file__).resolve().parents[1]  # where `bench` is importable from, for the workers


# The flags CPU figures depend on: AVX-512 kernels, bf16 dot products (AVX512_BF16), Intel's AMX tiles.
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16")


def cpu_line(cpuinfo: str | None = None, usable: int | None = None) -> str:
    """The CPU a bench ran on, for the header of every bench: the model name (with vendor, family and
    model numbers, since a hypervisor may show only "AMD EPYC"), the CPUs this process may use, which of
    :data:`CPU_FLAGS` it has and lacks, and the kernel level torch dispatches to (where torch is loaded).
    ``cpuinfo``: /proc/cpuinfo's text (read here by default); ``usable``: the CPU count (this process's)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
        except OSError:
            cpuinfo = ""
    first = {}
    for line in cpuinfo.split("\n\n")[0].splitlines():  # the first processor's block
        key, _, value = line.partition(":")
        first.setdefault(key.strip(), value.strip())
    if usable is None:
        usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    import platform

    name = first.get("model name") or platform.processor() or platform.machine() or "unknown CPU"
    ids = [f"{first[k]}" if k == "vendor_id" else f"{k.split()[-1]} {first[k]}"
           for k in ("vendor_id", "cpu family", "model") if first.get(k)]
    flags = set(first.get("flags", "").split())
    line = f"CPU: {name}" + (f" ({', '.join(ids)})" if ids else "") + f", {usable} usable CPU(s)"
    if flags:
        has = [f for f in CPU_FLAGS if f in flags]
        lacks = [f for f in CPU_FLAGS if f not in flags]
        line += f"; has {' '.join(has) or '-'}; lacks {' '.join(lacks) or '-'}"
    torch = sys.modules.get("torch")
    capability = getattr(getattr(getattr(torch, "backends", None), "cpu", None), "get_cpu_capability", None)
    if capability is not None:
        line += f"; torch CPU kernels: {capability()}"
    return line


def print_cpu_line() -> None:
    """Print :func:`cpu_line` (every bench's header: CPU figures hold for the CPU they were taken on)."""
    print(cpu_line(), flush=True)


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def measure_step(step, repeats: int) -> dict:
    """Run ``step()`` once for the extra peak RSS, then ``repeats`` times for wall time."""
    baseline = peak_rss_bytes()
    # The high-water mark only rises past the baseline if setup left no higher transient peak.
    if baseline - current_rss_bytes() > 64 * MIB:
        raise SystemExit("input setup peaked above its final memory; the step's extra peak would be understated")
    checksum = step()
    extra_peak = peak_rss_bytes() - baseline
    times, cpu_times = [], []
    for _ in range(repeats):
        start, cpu_start = time.perf_counter(), time.process_time()
        step()
        times.append(time.perf_counter() - start)
        cpu_times.append(time.process_time() - cpu_start)
    return {
        "extra_peak_mib": extra_peak / MIB,
        "median_ms": 1e3 * statistics.median(times),
        "min_ms": 1e3 * min(times),
        "cpu_ms": 1e3 * statistics.median(cpu_times),
        "checksum": checksum,
    }


def saved_for_backward_mib(forward) -> float:
    """MiB of distinct storage that ``forward()`` keeps alive for its backward.

    Inputs count too: a caller could free them if the op did not hold them. This is what
    stays alive from the forward to the backward pass, once per layer in a model, so it
    adds up where one op's transient peak does not.
    """
    import torch

    saved = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        forward()
    return sum(saved.values()) / MIB


def run_worker(module: str, variant: str, argv: list[str]) -> dict:
    """Run ``python -m module --worker VARIANT argv...`` in a fresh interpreter (a bench passes its own
    ``__spec__.name``); return its JSON result."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    done = subprocess.run(
        [sys.executable, "-m", module, "--worker", variant, *argv], capture_output=True, text=True, check=False,
        env=env,
    )
    if done.returncode != 0:
        raise SystemExit(f"{variant}: worker failed (exit {done.returncode}):\n{done.stderr.strip()}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_agreeing_variants(module: str, variants, argv: list[str]) -> tuple[list[dict], float]:
    """A fresh worker per variant (``run_worker``); the rows and their common loss, refusing variants
    whose losses (the workers' checksums) disagree."""
    rows = [{"variant": v, **run_worker(module, v, argv)} for v in tqdm(variants, desc="variants", leave=False)]
    losses = [r["checksum"] for r in rows]
    if not all(math.isclose(loss, losses[0], rel_tol=1e-3) for loss in losses):
        raise SystemExit(f"variants disagree on the loss: {dict(zip(variants, losses))}")
    return rows, losses[0]


def print_table(rows: list[dict], reference: str) -> None:
    """One line per variant, with time and extra-peak ratios against ``reference``; "saved MiB" (what
    autograd keeps for backward) shows "-" for benches that do not measure it."""
    ref = next(r for r in rows if r["variant"] == reference)
    print(
        f"{'variant':<18} {'median ms':>10} {'min ms':>9} {'cpu ms':>9} {'extra peak MiB':>15} "
        f"{'saved MiB':>10} {'speedup':>8} {'peak ratio':>11}"
    )
    for r in rows:
        speedup = ref["median_ms"] / r["median_ms"]
        peak_ratio = r["extra_peak_mib"] / ref["extra_peak_mib"] if ref["extra_peak_mib"] > 0 else float("nan")
        print(
            f"{r['variant']:<18} {r['median_ms']:>10.1f} {r['min_ms']:>9.1f} {r['cpu_ms']:>9.1f} "
            f"{r['extra_peak_mib']:>15.1f} {_saved(r):>10} "
            f"{speedup:>7.2f}x {peak_ratio:>11.2f}"
        )


def _saved(row: dict) -> str:
    return f"{row['saved_mib']:.1f}" if "saved_mib" in row else "-"
