"""glm-mock: run unmodified GLM-era code (apex, DeepSpeed, torch._six, CUDA calls) on shim."""

from __future__ import annotations

import argparse
import os
import shutil
import sys

from migrate.mock import environ as mock_env
from migrate.mock.finder import ENV_DISABLE, MockFinder, find_installed, parse_forced
from migrate.mock.plan import load_plan, resolve, scope_of, scopes
from migrate.rules import rules_dir

EPILOG = f"""\
examples:
  eval "$(glm-mock)"                 turn the mock on for this shell and its children
  eval "$(glm-mock disable)"         turn it off, PYTHONPATH restored exactly
  glm-mock run -- torchrun --nproc_per_node 2 pretrain_glm.py ...
  glm-mock --list                    what would be redirected, before anything runs

A real apex or DeepSpeed that is installed wins over the stand-in unless --force
names it. {ENV_DISABLE}=1 turns the mock off without touching PYTHONPATH.
"""


def _force_arg(parser):
    parser.add_argument(
        "--force",
        nargs="?",
        const="all",
        default="",
        metavar="PKG[,PKG]",
        help=f"use the stand-in even where the real package is installed ({', '.join(scopes())}; default: all)",
    )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="glm-mock",
        description="Redirect apex, DeepSpeed, torch._six and CUDA-only calls to shim at import time, "
        "so unmodified GLM-era code runs on today's PyTorch, with or without a GPU.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="{enable,disable,run,list}")
    enable = sub.add_parser("enable", help="print shell code that turns the mock on (the default command)")
    _force_arg(enable)
    disable = sub.add_parser("disable", help="print shell code that turns the mock off")
    for p in (enable, disable):
        p.add_argument("--shell", choices=("sh", "fish"), default="sh", help="shell syntax (sh: bash, zsh, dash)")
    run = sub.add_parser("run", help="run one command with the mock on: glm-mock run -- CMD ...")
    _force_arg(run)
    run.add_argument("cmd", nargs=argparse.REMAINDER, help="the command and its arguments")
    listing = sub.add_parser("list", help="dry run: list what would be redirected and what backs it")
    _force_arg(listing)
    return parser


def _normalise(argv: list[str]) -> list[str]:
    """``glm-mock`` alone means ``enable``; ``glm-mock --list`` means ``list``."""
    if "--list" in argv and argv[0] != "run":  # after `run`, --list belongs to the command
        return ["list"] + [a for a in argv if a != "--list"]
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        return ["enable", *argv]
    return argv


def _check_force(parser, value: str) -> str:
    try:
        parse_forced(value, "--force")
    except ValueError as exc:
        parser.error(str(exc))
    return value


def _cuda_line() -> str:
    import torch

    if torch.cuda.is_available():
        return "CUDA present: shim.compat.install() adds only torch._six and torch.load's old default (weights_only=False) when torch is imported"
    return "no CUDA: shim.compat.install() runs when torch is imported (torch.cuda, .cuda(), 'cuda' devices, nccl -> CPU/gloo; torch.load's weights_only=False default)"


def _backing(redirect) -> str:
    if redirect.kind == "not covered":
        return f"not covered: {redirect.note}"
    try:
        resolve(redirect.target)
    except (ImportError, AttributeError) as exc:
        return f"{redirect.target}  [MISSING: {exc}]"
    return redirect.target


def list_plan(force: str) -> str:
    plan = load_plan()
    finder = MockFinder(parse_forced(force))
    lines = [f"glm-mock plan (rules: {rules_dir()})", f"torch: {_cuda_line()}", ""]
    for scope, real_name in scopes().items():
        spec = find_installed(scope)
        if not finder.serves(scope):
            lines.append(f"{scope:<11} real package wins: {spec.origin} (--force {scope} to use the stand-in)")
        elif spec is not None:
            lines.append(f"{scope:<11} stand-in, forced over the installed {spec.origin}")
        else:
            lines.append(f"{scope:<11} stand-in ({real_name} not installed)")
    lines.append("")
    width = max(len(name) for name in plan.redirects)
    for name in sorted(plan.redirects):
        redirect = plan.redirects[name]
        used = "" if finder.serves(scope_of(name)) else "  (real package used)"
        shown = f"{name}.*" if redirect.kind == "not covered" and name in plan.modules else name
        lines.append(f"{redirect.code or 'mock':<7} {shown:<{width + 2}}  {_backing(redirect)}{used}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    try:
        status = _main(argv)
        sys.stdout.flush()  # a reader that went away (`glm-mock --list | head`) shows here, not at exit
        return status
    except BrokenPipeError:
        # Python's documented way: stdout to devnull, so the interpreter's last flush at exit stays quiet.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def _main(argv: list[str] | None) -> int:
    parser = _parser()
    args = parser.parse_args(_normalise(sys.argv[1:] if argv is None else list(argv)))
    if args.command == "list":
        print(list_plan(_check_force(parser, args.force)))
        return 0
    if args.command == "disable":
        print(mock_env.shell_code(mock_env.disable_changes(os.environ), args.shell))
        return 0
    changes = mock_env.enable_changes(os.environ, _check_force(parser, args.force))
    if args.command == "enable":
        if sys.stdout.isatty():
            print('# glm-mock prints shell code; to apply it: eval "$(glm-mock)"', file=sys.stderr)
        print(mock_env.shell_code(changes, args.shell))
        return 0
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        parser.error("run: give a command, e.g. glm-mock run -- python train.py")
    if shutil.which(cmd[0]) is None:
        parser.error(f"run: command not found: {cmd[0]}")
    sys.stdout.flush()
    os.execvpe(cmd[0], cmd, mock_env.apply(os.environ, changes))


if __name__ == "__main__":
    sys.exit(main())
