"""Time per iteration: THUDM/GLM's pretrain_glm.py, original (under glm-mock) vs migrated (no mock).

    python -m bench.upstream /path/to/GLM [--mode 1] [--iters 30] [--repeats 3]

Same tiny flags as ``glm-migrate --verify``. The two trees run in turns (original, migrated,
original, ...) so that load from other processes falls on both alike; each run's time is the
median of the per-iteration times upstream logs (the first iteration left out). Prints each run
and, per side, the best and the median run, and the ratio original / migrated (> 1: the
migrated tree is faster).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from tqdm import tqdm

import harness
from bench._measure import print_cpu_line
from harness import verify


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("upstream", type=Path, help="THUDM/GLM checkout (a copy is used)")
    p.add_argument("--mode", choices=list(verify.MODES), default="1", help="as in glm-migrate --verify")
    p.add_argument("--iters", type=int, default=30, help="iterations per run")
    p.add_argument("--repeats", type=int, default=3, help="runs per side")
    p.add_argument("--vocab", type=Path, help=f"BERT's {harness.VOCAB_NAME} (or a directory holding it) if the "
                   f"checkout lacks one (default: ${harness.VOCAB_ENV})")
    p.add_argument("--workdir", type=Path, help="scratch directory (default: a new temporary one)")
    args = p.parse_args()
    if not (args.upstream / "pretrain_glm.py").is_file():
        p.error(f"{args.upstream} is not a THUDM/GLM checkout (no pretrain_glm.py)")
    print_cpu_line()

    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="glm-bench-upstream-"))).resolve()
    try:
        original, ported = verify.prepare(args.upstream.resolve(), workdir, args.vocab)
    except harness.HarnessError as exc:
        p.error(str(exc))
    sides = {
        "original": (original, harness.mock_env(""), ["pretrain_glm.py"]),
        "migrated": (ported, harness.ported_env(), verify.PORTED_LAUNCH),
    }
    times: dict[str, list[float]] = {name: [] for name in sides}
    for repeat in tqdm(range(args.repeats), desc=f"mode {args.mode}", unit="pair"):
        for name, (tree, env, launch) in sides.items():
            run = verify.pretrain(tree, env, args.mode, args.iters, 900, launch)
            if run.code != 0:
                raise SystemExit(f"{name} run failed with exit code {run.code}; log: {run.log}")
            times[name].append(run.median_ms)
            tqdm.write(f"run {repeat + 1} {name:<8}: {run.median_ms:7.1f} ms per iteration")
    for name, values in times.items():
        print(f"{name:<8}: best {min(values):7.1f} ms, median {statistics.median(values):7.1f} ms per iteration")
    best = min(times["original"]) / min(times["migrated"])
    median = statistics.median(times["original"]) / statistics.median(times["migrated"])
    print(f"original / migrated: {best:.2f}x (best runs), {median:.2f}x (median runs); mode {args.mode}, "
          f"{args.iters} iterations, {args.repeats} runs per side")  # fmt: skip


if __name__ == "__main__":
    main()
