"""Check glm-mock against a THUDM/GLM checkout, which is run unmodified.

    python -m harness.selfcheck /path/to/GLM [--nproc 1 2] [--iters 20] [--no-mpu-tests]
    python -m migrate.mock.selfcheck ...      (the same command, under its first name)

The checkout is copied to a scratch directory (upstream writes logs beside
itself), a BERT vocabulary is linked where upstream looks for it
(``.pytorch_pretrained_bert/``) if it lacks one (``--vocab`` or ``$GLM_VOCAB``), and
``--train-data test`` gets its corpus at the path the checkout names
(``TestDataset.PATH`` in ``data_utils/corpora.py``; written only if absent).
Then, with the mock on: ``pretrain_glm.py`` trains a 2-layer, hidden-64 GLM on
CPU in fp32 for each process count, its losses must be finite and falling; and
each ``mpu/tests`` script runs under ``torchrun --nproc_per_node 2``.
Exit status: 0 all pass, 1 a failure, 2 bad input.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from harness.upstream import (
    LOSS, MPU_TESTS, PRETRAIN_FLAGS, UPSTREAM_DEFECTS, VOCAB_ENV, VOCAB_NAME, HarnessError, check_checkout,
    checkout_corpus, free_port, mock_env, prepare_tree, run_upstream,
)  # fmt: skip


@dataclass
class Outcome:
    name: str
    status: str  # PASS, FAIL, or UPSTREAM: fails for upstream's own reason, on any hardware
    detail: str
    log: Path


def check_pretrain(tree: Path, nproc: int, iters: int, force: str, timeout: int) -> Outcome:
    env = mock_env(force)
    port = str(free_port())
    flags = [*PRETRAIN_FLAGS, "--train-iters", str(iters)]
    if nproc == 1:
        env.update(WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        cmd = [sys.executable, "pretrain_glm.py", *flags]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
               "--master_addr", "127.0.0.1", "--master_port", port, "pretrain_glm.py", *flags]  # fmt: skip
    name = f"pretrain_glm.py, {nproc} process{'es' if nproc > 1 else ''}"
    log = tree.parent / f"pretrain_nproc{nproc}.log"
    code, text = run_upstream(cmd, tree, env, log, timeout)
    losses = [float(x) for x in LOSS.findall(text)]
    if code != 0:
        return Outcome(name, "FAIL", f"exit code {code}", log)
    if len(losses) != iters:
        return Outcome(name, "FAIL", f"{len(losses)} loss lines for {iters} iterations", log)
    k = max(1, iters // 4)
    head, tail = sum(losses[:k]) / k, sum(losses[-k:]) / k
    ok = all(math.isfinite(x) for x in losses) and tail < head
    detail = f"lm loss {losses[0]:.4f} -> {losses[-1]:.4f} (mean of first {k} {head:.4f}, last {k} {tail:.4f})"
    return Outcome(name, "PASS" if ok else "FAIL", detail, log)


def check_mpu_test(tree: Path, script: str, force: str, timeout: int) -> Outcome:
    # From the repository root; the scripts find `commons` beside them, and `mpu` through the
    # user's PYTHONPATH, which the mock keeps behind its own entry.
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), f"mpu/tests/{script}"]  # fmt: skip
    log = tree.parent / f"mpu_{Path(script).stem}.log"
    code, text = run_upstream(cmd, tree, mock_env(force, PYTHONPATH=str(tree)), log, timeout)
    name = f"mpu/tests/{script}"
    if code == 0:
        return Outcome(name, "PASS", "passed", log)
    defect = UPSTREAM_DEFECTS.get(script)
    if defect and defect in text:
        passed = text.count(">> passed the test")
        return Outcome(name, "UPSTREAM", f"upstream's own defect, not the mock: {defect} "
                       f"(after {passed} '>> passed the test' lines)", log)  # fmt: skip
    errors = [line for line in text.splitlines() if "Error" in line]
    return Outcome(name, "FAIL", f"exit code {code}: {errors[-1] if errors else 'see log'}", log)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m harness.selfcheck",
        description="Run an unmodified THUDM/GLM checkout under glm-mock on CPU: pretrain_glm.py "
        "(2 layers, hidden 64, fp32, --train-data test) and the mpu/tests scripts.",
    )
    parser.add_argument("upstream", type=Path, help="THUDM/GLM checkout (left untouched; a copy is run)")
    parser.add_argument("--nproc", type=int, nargs="*", default=[1, 2], help="process counts to pretrain with (none: skip)")
    parser.add_argument("--iters", type=int, default=20, help="training iterations per run")
    parser.add_argument("--no-mpu-tests", action="store_true", help="skip upstream's mpu/tests scripts")
    parser.add_argument("--force", default="", help="passed to glm-mock: stand-ins win over installed packages")
    parser.add_argument("--vocab", type=Path, help=f"BERT's {VOCAB_NAME} (or a directory holding it) to use if the "
                        f"checkout lacks one (default: ${VOCAB_ENV})")
    parser.add_argument("--workdir", type=Path, help="scratch directory (default: a new temporary one)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds allowed per run")
    args = parser.parse_args(argv)
    try:
        upstream = check_checkout(args.upstream)
        workdir = args.workdir or Path(tempfile.mkdtemp(prefix="glm-mock-selfcheck-"))
        tree = prepare_tree(upstream, workdir.resolve(), args.vocab)
        checkout_corpus(tree)
    except HarnessError as exc:
        parser.error(str(exc))
    checks = [lambda n=n: check_pretrain(tree, n, args.iters, args.force, args.timeout) for n in args.nproc]
    if not args.no_mpu_tests:
        checks += [lambda s=s: check_mpu_test(tree, s, args.force, args.timeout) for s in MPU_TESTS]
    outcomes = []
    for check in tqdm(checks, desc="glm-mock selfcheck", unit="run", disable=None):  # None: no bar unless a terminal
        outcome = check()
        outcomes.append(outcome)
        tqdm.write(f"{outcome.status:<8}  {outcome.name}: {outcome.detail}  (log: {outcome.log})")
    counts = {status: sum(o.status == status for o in outcomes) for status in ("PASS", "UPSTREAM", "FAIL")}
    print(f"{counts['PASS']} passed, {counts['UPSTREAM']} failed for upstream's own reason, "
          f"{counts['FAIL']} failed; logs in {workdir}")  # fmt: skip
    return 1 if counts["FAIL"] else 0


if __name__ == "__main__":
    sys.exit(main())
