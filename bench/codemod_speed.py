"""How long ``glm-migrate`` takes on a whole tree (the bars: THUDM/GLM, 69 files, 22k lines, <= 5 s wall;
Megatron-LM v2.6, 125 files, 25k lines, under 2 s; 20x PaConvert's documented ~2,000 lines/s).

    python -m bench.codemod_speed [SRC] [--repeats N] [--baseline]

Times the real command (a fresh process each run, start-up included) writing a
full DST, with ``-j 1`` and with the default (one worker per core). ``--baseline``
also times what a libcst-only design would pay before rewriting anything: parsing
every file into a full libcst tree, with and without libcst's scope analysis
(``QualifiedNameProvider``), which is why the analysis runs on the stdlib ``ast``.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench._measure import print_cpu_line

SRC_ENV = "GLM_UPSTREAM"  # the tests' name for a THUDM/GLM checkout
PACONVERT_LINES_PER_S = 2000  # PaConvert's documented conversion rate (PyTorch -> Paddle)


def time_command(src: Path, jobs: int | None, repeats: int) -> tuple[list[float], list[float]]:
    """Wall seconds and CPU seconds (user + system, all processes) of each run."""
    walls, cpus = [], []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as tmp:
            command = [sys.executable, "-m", "migrate.cli", str(src), "-o", f"{tmp}/out", "--quiet"]
            if jobs is not None:
                command += ["-j", str(jobs)]
            before = resource.getrusage(resource.RUSAGE_CHILDREN)
            start = time.perf_counter()
            subprocess.run(command, check=True)
            walls.append(time.perf_counter() - start)
            after = resource.getrusage(resource.RUSAGE_CHILDREN)
            cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
    return walls, cpus


def time_libcst(files: list[Path], with_names: bool) -> float:
    import libcst as cst
    from libcst.metadata import MetadataWrapper, QualifiedNameProvider

    start = time.perf_counter()
    for path in files:
        module = cst.parse_module(path.read_bytes())
        if with_names:
            MetadataWrapper(module).resolve(QualifiedNameProvider)
    return time.perf_counter() - start


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", nargs="?", type=Path, default=os.environ.get(SRC_ENV) or None,
                   help=f"tree to migrate, e.g. a THUDM/GLM checkout (default: ${SRC_ENV})")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--baseline", action="store_true", help="also time libcst-only parsing and name resolution")
    args = p.parse_args()
    if args.src is None:
        p.error(f"give the tree to migrate (SRC), or set {SRC_ENV}=/path/to/GLM")
    print_cpu_line()
    if not args.src.is_dir():
        p.error(f"no source tree at {args.src}")
    files = sorted(args.src.rglob("*.py"))
    lines = sum(len(f.read_bytes().splitlines()) for f in files)
    load = os.getloadavg()[0]
    print(f"tree: {args.src} ({len(files)} Python files, {lines} lines); {os.cpu_count()} cores, load {load:.1f}")
    # wall time depends on what else runs on the machine; CPU time much less so
    print(f"{'variant':<38} {'best s':>7} {'median s':>9} {'lines/s':>8} {'cpu s':>6} {'x PaConvert':>11}")
    for label, jobs in (("glm-migrate -j 1", 1), ("glm-migrate (default -j)", None)):
        walls, cpus = time_command(args.src, jobs, args.repeats)
        best = min(walls)
        print(f"{label:<38} {best:7.2f} {statistics.median(walls):9.2f} {lines / best:8.0f} {min(cpus):6.2f} "
              f"{lines / best / PACONVERT_LINES_PER_S:10.1f}x")
    if args.baseline:
        for label, names in (("libcst parse only", False), ("libcst parse + QualifiedNameProvider", True)):
            seconds = time_libcst(files, names)
            print(f"{label:<38} {seconds:7.2f} {'':>9} {lines / seconds:8.0f}")


if __name__ == "__main__":
    main()
