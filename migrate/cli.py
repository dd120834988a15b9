"""``glm-migrate``: the command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from migrate import interrupt

DESCRIPTION = """\
Rewrite a GLM-era (Megatron / DeepSpeed / apex) source tree onto shim, today's
PyTorch plus portable stand-ins: torch imports become shim, apex fused optimizers
and layer norm become shim's, DeepSpeed activation checkpointing, torch.distributed,
torch.cuda, .cuda() and removed APIs (torch._six, memory_cached, np.long) are
rewritten, and mpu.vocab_parallel_cross_entropy becomes the fused cross-entropy.
The mappings are the tables in rules/*.toml (see docs/rules.md).

Writes DST/migration_report.json and DST/MIGRATION_REPORT.md: every change, every
construct left unconverted (with its line and why), and a summary. SRC may be one .py
file: with -o NAME.py the result is that one file (reports only with --report).

DST is complete or untouched: built aside and moved into place at the end. It may not
contain SRC or lie inside it. An existing DST must be empty, or a tree glm-migrate wrote
before (it leaves DST/.glm-migrate.json listing its files): --force replaces that, and
refuses, naming them, if files were added or edited there since."""

EPILOG = """\
exit status: 0 done; 1 a Python file could not be migrated (does not parse or decode, or is
not Python: named, copied unchanged), or --check found files to change; 2 usage or I/O
error; 130 interrupted (Ctrl-C: DST is left as it was).
examples:
  glm-migrate GLM -o GLM-shim            migrate a tree into a new directory
  glm-migrate GLM --diff --select APX    show what the apex rules would change
  glm-migrate GLM-shim --check           exit 1 if anything is left to migrate
  glm-migrate --verify GLM [--iters N]   migrate GLM, train original and port, compare losses
                                         (see glm-migrate --verify --help)"""


def _codes(text: str) -> set[str]:
    return {code.strip().upper() for code in text.split(",") if code.strip()}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="glm-migrate", description=DESCRIPTION, epilog=EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("src", type=Path, metavar="SRC", help="source tree (or one .py file) to migrate")
    out = p.add_mutually_exclusive_group()
    out.add_argument("-o", "--output", type=Path, metavar="DST", help="write the migrated tree here (SRC a .py file and DST NAME.py: that one file)")
    out.add_argument("--in-place", action="store_true", help="rewrite the files under SRC")
    p.add_argument("--diff", action="store_true", help="print a unified diff and write nothing")
    p.add_argument("--check", action="store_true",
                   help="write nothing; list the files that would change or could not be checked, "
                   "and exit 1 if there is any (for CI)")
    p.add_argument("-j", "--jobs", type=int, default=0, metavar="N",
                   help="worker processes (default: one per core)")
    p.add_argument("--select", type=_codes, metavar="CODES",
                   help="only these rules: comma-separated codes or families (APX001, DSC, ...)")
    p.add_argument("--ignore", type=_codes, default=set(), metavar="CODES",
                   help="skip these rules: comma-separated codes or families")
    p.add_argument("--report", type=Path, metavar="PATH",
                   help="write the JSON report here (and the Markdown one beside it as .md)")
    p.add_argument("--rules", type=Path, metavar="DIR",
                   help="read the rule tables from DIR instead of the built-in rules/ (same schema)")
    p.add_argument("--force", action="store_true",
                   help="replace DST if glm-migrate wrote it before and nothing there was added or edited "
                   "since; with a single .py file, overwrite DST")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar and no summary line")
    return p


def main(argv: list[str] | None = None) -> int:
    """The command; ``argv=None`` means the process's own arguments (and that it exits after:
    a Ctrl-C then leaves every later one ignored, so none prints a traceback)."""
    own_process = argv is None
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--verify"]:
        from harness import verify  # the upstream harness: its own parser and exit status

        return verify.main(argv[1:])
    try:
        with interrupt.handling(restore=not own_process):  # before the heavy imports: Ctrl-C is handled from here
            return _main(argv)
    except KeyboardInterrupt:
        print("glm-migrate: interrupted", file=sys.stderr)
        # A KeyboardInterrupt that passed through exec() of a string (dataclasses builds its methods
        # so, during imports) marks CPython's "unhandled KeyboardInterrupt" flag, and the process
        # would then end by SIGINT (status -2) whatever it returns; a fresh exec() clears the flag.
        exec("pass")
        return 130


def _main(argv: list[str]) -> int:
    from migrate.rules import RuleError
    from migrate.runner import MigrateError, Options, run

    p = parser()
    args = p.parse_args(argv)
    if not (args.output or args.in_place or args.diff or args.check):
        p.error("say where the result goes: -o DST or --in-place (or --diff / --check to write nothing)")
    if args.jobs < 0:
        p.error("-j must be 0 (one per core) or more")
    options = Options(
        src=args.src, dst=args.output, in_place=args.in_place, diff=args.diff, check=args.check,
        jobs=args.jobs, select=args.select, ignore=frozenset(args.ignore), report=args.report,
        quiet=args.quiet, force=args.force, rules_dir=str(args.rules) if args.rules else None,
    )
    try:
        return run(options)
    except (MigrateError, RuleError) as exc:
        print(f"glm-migrate: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
