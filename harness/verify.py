"""Check a migration end to end against a THUDM/GLM checkout.

    glm-migrate --verify /path/to/GLM [--iters 20] [--modes 1 dp2 tp2]
    python -m harness.verify /path/to/GLM ...

The checkout is copied to a scratch directory and migrated there. The migrated
tree is checked statically (what the ``[[forbid]]`` tables of ``rules/`` list: no apex
import left, no ``mpu.vocab_parallel_cross_entropy`` call outside ``mpu/``; every file
compiles, data files byte for byte, a second migration changes nothing). Then, for each
mode, upstream's ``pretrain_glm.py`` trains a tiny GLM (2 layers, hidden 64, dropout 0, seed 1234, fp32, CPU) twice:
the original under ``glm-mock``, the migrated tree with no mock and with apex and
DeepSpeed unimportable (``harness.without``), installed or not. The ``lm loss``
each prints per iteration (``X.XXXXXXE+00``, 7 significant digits) must agree
within ``--rtol``; a table shows both, and the time per iteration of each.
Last, the migrated ``mpu/tests`` scripts run under torchrun with two processes.

A run that fails is reported in one line with the exception it ended on (``original run failed:
ModuleNotFoundError: No module named 'tensorboardX'``), its log kept; upstream's own run-time
dependencies are the ``upstream`` extra (``pip install -e ".[upstream]"``, docs/upstream.md).

Modes: ``1`` one process; ``dp2`` two processes under torchrun (data parallel);
``tp2`` two processes with ``--model-parallel-size 2`` (tensor parallel).

``--entry-points`` chooses what runs (default ``pretrain``: the modes above and mpu/tests): the
other entry points of :mod:`harness.entrypoints` (``resume``, ``superglue``, ``copa``, ``seq2seq``, ``xsum``,
``blank``, ``lambada``, ``wikitext``, ``zero_lm``, ``multichoice``, ``generate``, ``change_mp``...; ``all``) run in one process on both sides
from one pretrained checkpoint, on data written in upstream's formats, and their printed figures
(losses, accuracies, ROUGE, perplexity, generated text, resharded tensors) must agree within
``--entry-rtol``.
Exit status: 0 all match, 1 a mismatch or a failed run, 2 bad input.
"""

from __future__ import annotations

import argparse
import ast
import math
import os
import re
import signal
import statistics
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from harness import upstream as up
from harness.entrypoints import CLUE_TASKS, ENTRY_POINTS, EntryComparison, Figures, SideRun, pretrained_checkpoint, pretrained_mp2, run_entry, write_data
from harness.entrypoints import MODES as ENTRY_MODES
from harness.entrypoints import NOT_RUN
from harness.entrypoints import table as entry_table
from harness.upstream import ELAPSED, ported_env
from migrate.rules import Forbid, load_tables
from migrate.runner import MANIFEST, Options, migrate_tree, run

MODES = {"1": (1, 1), "dp2": (2, 1), "tp2": (2, 2)}  # name -> (processes, model-parallel size)
MODE_TITLES = {"1": "one process", "dp2": "torchrun 2, data parallel", "tp2": "torchrun 2, --model-parallel-size 2"}
# Dropout off so both runs draw nothing random after initialisation; everything else as the mock's selfcheck.
EXTRA_FLAGS = ["--hidden-dropout", "0", "--attention-dropout", "0"]
# The migrated tree runs with these made unimportable (harness.without), installed or not.
ABSENT = "apex,amp_C,deepspeed"
PORTED_LAUNCH = ["-m", "harness.without", ABSENT, "pretrain_glm.py"]
RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d*\]: ?")  # torchrun may prefix each line of a rank's output
# ``Name: message`` (no space in the name), or a bare name that reads as an exception
EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*: \S.*|[A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit))$")
INSTALL_HINT = 'upstream\'s dependencies: pip install -e ".[upstream]" (docs/upstream.md)'


def failure_cause(code: int, text: str) -> str:
    """Why a run failed, in one line: the exception its first traceback ends with, else how it ended."""
    lines = [RANK_PREFIX.sub("", line).rstrip() for line in text.splitlines()]
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last):"):
            # the exception line that ends it; two ranks' tracebacks may interleave line by line
            later = next((x for x in lines[i + 1:] if EXCEPTION_LINE.match(x)), None)
            if later:
                hint = f"; {INSTALL_HINT}" if later.startswith("ModuleNotFoundError") else ""
                return later + hint
    timed_out = re.search(r"\[timed out after (\d+) s\]", text)
    if timed_out:
        return f"timed out after {timed_out.group(1)} s"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    last = next((line.strip() for line in reversed(lines) if line.strip()), "no output")
    return f"exit status {code}; last line: {last}"


@dataclass
class Run:
    code: int
    losses: list[float]
    ms_per_iter: list[float]
    log: Path
    cause: str = ""  # why it failed (one line), when code != 0

    @property
    def median_ms(self) -> float:
        steady = self.ms_per_iter[1:] or self.ms_per_iter  # the first iteration pays for warm-up
        return statistics.median(steady) if steady else float("nan")


@dataclass
class Comparison:
    mode: str
    original: Run
    ported: Run
    rtol: float
    problems: list[str] = field(default_factory=list)

    def __post_init__(self):
        for side, r in (("original", self.original), ("ported", self.ported)):
            if r.code != 0:
                self.problems.append(f"{side} run failed: {r.cause or f'exit status {r.code}'} (log: {r.log})")
        if self.failed:
            return  # its losses stop early or are missing: comparing them says nothing more
        if len(self.original.losses) != len(self.ported.losses):
            self.problems.append(f"{len(self.original.losses)} loss lines in the original, "
                                 f"{len(self.ported.losses)} in the ported run")  # fmt: skip
        for i, (a, b) in enumerate(zip(self.original.losses, self.ported.losses), 1):
            if relative(a, b) > self.rtol:
                self.problems.append(f"iteration {i}: lm loss {a:.6E} (original) vs {b:.6E} (ported)")

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def failed(self) -> bool:
        """A run did not finish (as opposed to both finishing with different losses)."""
        return self.original.code != 0 or self.ported.code != 0


def relative(a: float, b: float) -> float:
    return abs(a - b) / max(abs(a), abs(b), 1e-30)


def static_problems(src: Path, dst: Path) -> list[str]:
    """What the issue demands of the migrated tree itself; an empty list when all holds."""
    problems = []
    forbidden = load_tables().forbid  # the [[forbid]] entries of rules/*.toml
    for path in sorted(dst.rglob("*")):
        rel = path.relative_to(dst)
        if not path.is_file() or rel.name in ("migration_report.json", "MIGRATION_REPORT.md", MANIFEST):
            continue
        if not (src / rel).is_file():
            problems.append(f"{rel}: not in the original")
            continue
        if path.suffix != ".py":
            if path.read_bytes() != (src / rel).read_bytes():
                problems.append(f"{rel}: data file differs from the original")
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        try:
            tree = ast.parse(text, filename=str(rel))
            compile(tree, str(rel), "exec")
        except SyntaxError as exc:
            if _compiles(src / rel):  # upstream's own Python 2 leftovers are copied as they are
                problems.append(f"{rel}: does not compile: {exc.msg} (line {exc.lineno})")
            continue
        for node in ast.walk(tree):
            problems += [f"{rel}:{node.lineno}: {f.message}" for f in forbidden if _forbidden(f, node, rel)]
    originals = (p.relative_to(src) for p in src.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
    problems += [f"{rel}: not in the migrated tree" for rel in sorted(originals) if not (dst / rel).exists()]
    _, _, again = migrate_tree(Options(src=dst, quiet=True))
    if again["changes"]:
        problems.append(f"a second migration would make {again['changes']} more changes")
    return problems


def _forbidden(forbid: Forbid, node: ast.AST, rel: Path) -> bool:
    """Whether ``node`` (in the migrated file ``rel``) is what ``forbid`` says must not be left."""
    if forbid.what == "import":
        if isinstance(node, ast.Import):
            return any(a.name.split(".")[0] == forbid.name for a in node.names)
        return isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == forbid.name \
            and not node.level
    return isinstance(node, ast.Call) and _called_name(node) == forbid.name and rel.parts[0] != forbid.outside


def _called_name(call: ast.Call) -> str | None:
    func = call.func
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None


def _compiles(path: Path) -> bool:
    try:
        compile(path.read_bytes(), str(path), "exec")
    except SyntaxError:
        return False
    return True


def pretrain(tree: Path, env: dict, mode: str, iters: int, timeout: int, launch: list[str], extra=()) -> Run:
    """``launch`` (``pretrain_glm.py``, or a runner module and its arguments before it) with the
    tiny flags in ``tree``, as ``mode`` says; its printed losses and times."""
    nproc, model_parallel = MODES[mode]
    flags = list(up.PRETRAIN_FLAGS)
    flags[flags.index("--model-parallel-size") + 1] = str(model_parallel)
    flags += [*EXTRA_FLAGS, "--train-iters", str(iters), *extra]
    port = str(up.free_port())
    env = dict(env)
    if nproc == 1:
        env.update(WORLD_SIZE="1", RANK="0", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
        cmd = [sys.executable, *launch, *flags]
    else:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc),
               "--master_addr", "127.0.0.1", "--master_port", port, *launch, *flags]  # fmt: skip
    log = tree.parent / f"{tree.name}.{mode}.log"
    code, text = up.run_upstream(cmd, tree, env, log, timeout)
    losses = [float(x) for x in up.LOSS.findall(text)]
    return Run(code, losses, [float(x) for x in ELAPSED.findall(text)], log, failure_cause(code, text) if code else "")


def mpu_test(tree: Path, script: str, timeout: int) -> tuple[str, str]:
    """(status, detail) of one migrated ``mpu/tests`` script under torchrun, 2 processes, no mock.
    Status as the mock's selfcheck: PASS, FAIL, or UPSTREAM (fails on upstream itself, any hardware)."""
    env = ported_env()
    env["PYTHONPATH"] = os.pathsep.join((str(tree), env["PYTHONPATH"]))  # the scripts import `mpu` from the root
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_addr", "127.0.0.1", "--master_port", str(up.free_port()),
           "-m", "harness.without", ABSENT, f"mpu/tests/{script}"]  # fmt: skip
    log = tree.parent / f"{tree.name}.mpu_{Path(script).stem}.log"
    code, text = up.run_upstream(cmd, tree, env, log, timeout)
    passed = text.count(">> passed the test")
    if code == 0:
        return "PASS", f"{passed} '>> passed the test' lines"
    defect = up.UPSTREAM_DEFECTS.get(script)
    if defect and defect in text:
        return "UPSTREAM", f"{defect} (upstream's own; after {passed} '>> passed the test' lines)"
    return "FAIL", f"{failure_cause(code, text)} (log: {log})"


def prepare(upstream: Path, workdir: Path, vocab: Path | None = None) -> tuple[Path, Path]:
    """(original, ported): a runnable copy of the checkout and its migration, side by side, and the
    corpus where the checkout reads it. ``vocab``: see :func:`harness.find_vocab` (only if the checkout
    lacks its own)."""
    original = up.prepare_tree(upstream, workdir, vocab)
    up.checkout_corpus(original)
    ported = workdir / "GLM-ported"
    code = run(Options(src=original, dst=ported, force=True, quiet=True))
    if code not in (0, 1):  # 1: a file that does not parse, copied as it is (the static checks look at it)
        raise SystemExit(f"verify: glm-migrate {original} -o {ported} exited with {code}")
    return original, ported


def table(comparison: Comparison) -> str:
    """One mode's result: the losses side by side and the verdict, or why a run failed."""
    if comparison.failed:
        return "\n".join([f"## {MODE_TITLES[comparison.mode]}", "", *comparison.problems])
    lines = [f"## {MODE_TITLES[comparison.mode]}", "",
             "| iteration | original lm loss | ported lm loss | relative difference |",
             "| ---: | ---: | ---: | ---: |"]  # fmt: skip
    for i, (a, b) in enumerate(zip(comparison.original.losses, comparison.ported.losses), 1):
        lines.append(f"| {i} | {a:.6E} | {b:.6E} | {relative(a, b):.1e} |")
    o, p = comparison.original.median_ms, comparison.ported.median_ms
    if not (math.isnan(o) or math.isnan(p)):  # both printed their times
        lines += ["", f"median ms per iteration (after the first): original {o:.1f}, ported {p:.1f}, "
                  f"ported is {o / p:.2f}x the original's speed"]  # fmt: skip
    lines.append("")
    verdict = "MATCH" if comparison.ok else "MISMATCH"
    lines.append(f"{verdict} within rtol {comparison.rtol:g}" + "".join(f"\n  - {x}" for x in comparison.problems))
    return "\n".join(lines)


def run_entry_points(names: list[str], original: Path, ported: Path, workdir: Path, args) -> list[EntryComparison]:
    """Each entry point of ``names`` (harness.entrypoints) on both sides in each of ``args.entry_modes``
    it runs in, from one pretrained checkpoint (split to model-parallel 2 by change_mp.py for ``tp2``)
    and the data written under ``workdir``; a table printed per run."""
    data = write_data(workdir / "data")
    results = []
    try:
        pretrained = pretrained_checkpoint(ported, ported_env(), workdir, args.timeout)
    except up.HarnessError as exc:
        print(f"entry points not run: {exc}")
        failed = SideRun(1, Figures(), workdir / "pretrained.log", str(exc))
        return [EntryComparison(n, failed, failed, args.entry_rtol) for n in names]
    runs = [(name, mode) for mode in args.entry_modes for name in names if mode in ENTRY_MODES[name]]
    checkpoints = {("", "1"): pretrained}
    for name, mode in tqdm(runs, desc="entry points", unit="entry", disable=None):
        key = ("zh" if name in CLUE_TASKS else "", mode)  # CLUE: the checkpoint pretrained with the Chinese tokenizer
        for need in ((key[0], "1"), key):  # the one-process checkpoint first; a tp2 one is split from it
            if need in checkpoints:
                continue
            base = checkpoints.get((need[0], "1"))  # None: the Chinese one, not pretrained yet
            if isinstance(base, up.HarnessError):
                checkpoints[need] = base
                continue
            try:
                checkpoints[need] = (pretrained_checkpoint(ported, ported_env(), workdir, args.timeout, chinese=True)
                                     if base is None else pretrained_mp2(ported, ported_env(), base, workdir, args.timeout))  # fmt: skip
            except up.HarnessError as exc:
                checkpoints[need] = exc
        if isinstance(checkpoints[key], up.HarnessError):
            log = workdir / {("", "tp2"): "pretrained-mp2.log", ("zh", "1"): "pretrained-zh.log"}.get(key, "pretrained-zh-mp2.log")
            failed = SideRun(1, Figures(), log, str(checkpoints[key]))
            results.append(EntryComparison(name, failed, failed, args.entry_rtol, mode))
        else:
            theirs = run_entry(name, "original", original, up.mock_env(""), data, checkpoints[key], workdir,
                               args.timeout, mode)  # fmt: skip
            ours = run_entry(name, "ported", ported, ported_env(), data, checkpoints[key], workdir, args.timeout, mode)
            results.append(EntryComparison(name, theirs, ours, args.entry_rtol, mode))
        tqdm.write(entry_table(results[-1]) + "\n")
    return results


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="glm-migrate --verify",
        description="Migrate a THUDM/GLM checkout, train the original (under glm-mock) and the migrated tree "
        "(no mock) with the same tiny flags, and compare their losses iteration by iteration.",
        epilog="exit status: 0 every mode matches, 1 a mismatch or a failed run, 2 bad input.",
    )
    p.add_argument("upstream", type=Path, metavar="GLM", help="THUDM/GLM checkout (left untouched; a copy is used)")
    p.add_argument("--iters", type=int, default=20, help="training iterations per run (default 20)")
    p.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES),
                   help="1: one process; dp2: torchrun, 2 data-parallel ranks; tp2: --model-parallel-size 2")
    p.add_argument("--no-mpu-tests", action="store_true", help="skip the migrated mpu/tests scripts")
    p.add_argument("--rtol", type=float, default=1e-4, help="relative tolerance per printed loss (default 1e-4)")
    p.add_argument("--entry-modes", nargs="+", choices=["1", "tp2"], default=["1"],
                   help="modes for the entry points other than pretrain: 1 one process (default); tp2 torchrun 2 with "
                   "--model-parallel-size 2 from the checkpoint change_mp.py splits (not resume, change_mp)")
    p.add_argument("--entry-rtol", type=float, default=1e-6,
                   help="relative tolerance per number the other entry points print (default 1e-6: the last of 7 digits)")
    p.add_argument("--vocab", type=Path, help=f"BERT's {up.VOCAB_NAME} (or a directory holding it) to use if "
                   f"the checkout lacks one (default: ${up.VOCAB_ENV})")
    p.add_argument("--workdir", type=Path, help="scratch directory (default: a new temporary one); logs stay there")
    p.add_argument("--timeout", type=int, default=900, help="seconds allowed per training run")
    p.add_argument("--entry-points", nargs="+", choices=["pretrain", *ENTRY_POINTS, "all"], default=["pretrain"],
                   metavar="NAME", help="which of upstream's entry points to run on both sides (default: pretrain; "
                   f"all: every one): pretrain, {', '.join(ENTRY_POINTS)} (docs/upstream.md)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if not (args.upstream / "pretrain_glm.py").is_file():
        p.error(f"{args.upstream} is not a THUDM/GLM checkout (no pretrain_glm.py)")
    if args.iters < 2:
        p.error("--iters must be 2 or more")
    workdir = (args.workdir or Path(tempfile.mkdtemp(prefix="glm-migrate-verify-"))).resolve()
    try:
        original, ported = prepare(args.upstream.resolve(), workdir, args.vocab)
    except up.HarnessError as exc:
        p.error(str(exc))
    problems = static_problems(original, ported)
    print(f"migrated {original} -> {ported}: " + ("all static checks hold" if not problems else "PROBLEMS"))
    for problem in problems:
        print(f"  - {problem}")

    entries = ["pretrain", *ENTRY_POINTS] if "all" in args.entry_points else list(dict.fromkeys(args.entry_points))
    mocked = up.mock_env("")
    comparisons = []
    modes = args.modes if "pretrain" in entries else []
    for mode in tqdm(modes, desc="verify", unit="mode", disable=None):  # None: no bar unless a terminal
        orig_run = pretrain(original, mocked, mode, args.iters, args.timeout, ["pretrain_glm.py"])
        port_run = pretrain(ported, ported_env(), mode, args.iters, args.timeout, PORTED_LAUNCH)
        comparisons.append(Comparison(mode, orig_run, port_run, args.rtol))
        tqdm.write(table(comparisons[-1]) + "\n")
    failed = (["static checks"] if problems else []) + [c.mode for c in comparisons if not c.ok]
    others = [e for e in entries if e != "pretrain"]
    entry_results = run_entry_points(others, original, ported, workdir, args) if others else []
    if "all" in args.entry_points:  # upstream's scripts that no entry point runs, and why
        for script, why in NOT_RUN.items():
            print(f"not run: {script}: {why}")
    failed += [c.name for c in entry_results if not c.ok]
    scripts = [] if args.no_mpu_tests or "pretrain" not in entries else up.MPU_TESTS
    for script in tqdm(scripts, desc="mpu/tests", unit="script", disable=None):
        status, detail = mpu_test(ported, script, args.timeout)
        tqdm.write(f"{status:<8}  migrated mpu/tests/{script} (torchrun 2, no mock): {detail}")
        if status == "FAIL":
            failed.append(f"mpu/tests/{script}")
    matched = sum(c.ok for c in comparisons)
    counts = [f"{matched} of {len(comparisons)} modes match"] if "pretrain" in entries else []
    if entry_results:
        counts.append(f"{sum(c.ok for c in entry_results)} of {len(entry_results)} entry points match")
    print("; ".join(counts) + (f"; failing: {', '.join(failed)}" if failed else "") + f"; logs in {workdir}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
