"""Run a Python script as ``__main__`` and print its peak memory when it exits.

    python -m bench.peak_memory SCRIPT [ARGS...]
    python -m bench.peak_memory -m MODULE [ARGS...]

The last line of output is ``peak memory (MiB): rss R | cuda C``: R is the process's peak resident
set (Linux's ``VmHWM``, :func:`peak_rss_bytes`), C the peak of ``torch.cuda.max_memory_allocated`` (``-`` without CUDA). It lets
bench/pretrain.py measure upstream's scripts, which report no memory of their own, unmodified.

It imports nothing from this checkout: bench/pretrain.py runs it by path inside upstream's tree, where
``bench`` is not importable (with glm-mock on, the checkout is not on ``PYTHONPATH``), and an import of
``bench`` at exit failed there, so no line was printed and the original's peak read as ``nan``.
``peak_rss_bytes`` lives here for that reason; ``bench._measure`` re-exports it for the op benches.
"""

from __future__ import annotations

import atexit
import os
import resource
import runpy
import sys

MIB = 1 << 20


def peak_rss_bytes() -> int:
    """This process's RSS high-water mark. Linux's ``VmHWM`` (this address space's own), not ``ru_maxrss``:
    Linux carries ``ru_maxrss`` across fork and exec, so a worker started by a parent that once held a large
    model would report the parent's peak and hide its own below it."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def report() -> None:
    rss_mib = peak_rss_bytes() / MIB
    cuda = "-"
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        cuda = f"{torch.cuda.max_memory_allocated() / 2**20:.1f}"
    print(f"peak memory (MiB): rss {rss_mib:.1f} | cuda {cuda}", flush=True)


def main() -> None:
    if len(sys.argv) < 2 or (sys.argv[1] == "-m" and len(sys.argv) < 3):
        sys.exit("usage: python -m bench.peak_memory SCRIPT [ARGS...] | -m MODULE [ARGS...]")
    atexit.register(report)
    if sys.argv[1] == "-m":
        module = sys.argv[2]
        sys.argv = [module, *sys.argv[3:]]
        sys.path[0] = os.getcwd()  # as `python -m MODULE` would set it
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        return
    script = sys.argv[1]
    if not os.path.isfile(script):
        sys.exit(f"peak_memory: {script}: no such file")
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python SCRIPT` would set it
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
