"""Migrate a whole tree: find files, migrate Python files in parallel, write the result atomically.

DST is built in a temporary directory beside it and renamed into place at
the end, so it is complete or absent; ``--in-place`` replaces each changed
file atomically once every file has been migrated.
"""

from __future__ import annotations

import difflib
import io
import os
import shutil
import sys
import tempfile
import time
import tokenize
from concurrent.futures import ProcessPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from migrate.codemod import migrate_source
from migrate.index import ModuleIndex, module_name
from migrate.report import FileReport, coverage, report_paths, summarize, to_json, to_markdown
from migrate.rules import RuleSet, load_rules

REPORT_NAMES = ("migration_report.json", "MIGRATION_REPORT.md")
_SERIAL_BELOW = 8  # files; fewer than this are not worth starting worker processes for


class MigrateError(Exception):
    """Bad input or an I/O failure: the message is printed and the exit status is 2."""


@dataclass
class Options:
    src: Path
    dst: Path | None = None
    in_place: bool = False
    diff: bool = False
    check: bool = False
    jobs: int = 0  # 0: one per core
    select: set[str] | None = None
    ignore: frozenset[str] = frozenset()
    report: Path | None = None
    quiet: bool = False
    force: bool = False
    rules_dir: str | None = None


@dataclass
class Result:
    relpath: Path
    original: bytes
    migrated: bytes | None  # None: unchanged
    report: FileReport | None  # None: not a Python file, copied as it is


# -- one file (runs in worker processes) ---------------------------------------

_worker: dict = {}


def _init_worker(root: Path, python_files: list[Path], rules: RuleSet) -> None:
    _worker.update(index=ModuleIndex(root, python_files, rules.reexport_words()), rules=rules,
                   triggers=[w.encode() for w in rules.trigger_words()])


def _migrate_file(relpath: Path, data: bytes) -> Result:
    report = FileReport(relpath.as_posix())
    if not any(word in data for word in _worker["triggers"]):
        return Result(relpath, data, None, report)
    try:
        encoding, _ = tokenize.detect_encoding(io.BytesIO(data).readline)
        source = data.decode(encoding)
    except (SyntaxError, UnicodeDecodeError, LookupError) as exc:
        report.error = f"cannot decode: {exc}"
        return Result(relpath, data, None, report)
    name = module_name(relpath)
    migrated, report = migrate_source(source, report.path, name, relpath.name == "__init__.py",
                                      _worker["index"], _worker["rules"])
    if migrated == source:
        return Result(relpath, data, None, report)
    return Result(relpath, data, migrated.encode(encoding), report)


def _migrate_star(args) -> Result:
    return _migrate_file(*args)


# -- the tree -------------------------------------------------------------------


def _walk(src: Path) -> tuple[Path, list[Path], list[Path]]:
    """(root, Python files, other files), paths relative to root; directory links count as files.
    ``__pycache__`` is left behind: its bytecode belongs to the sources before migration."""
    if src.is_file():
        return src.parent, [Path(src.name)], []
    python, other = [], []
    for directory, dirnames, filenames in os.walk(src):
        base = Path(directory).relative_to(src)
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        for name in [d for d in dirnames if (Path(directory) / d).is_symlink()]:
            dirnames.remove(name)
            other.append(base / name)
        for name in sorted(filenames):
            rel = base / name
            is_python = name.endswith(".py") and not (src / rel).is_symlink()
            (python if is_python else other).append(rel)
    return src, python, other


def _check_paths(options: Options) -> None:
    src = options.src
    if not src.exists():
        raise MigrateError(f"source not found: {src}")
    if not (src.is_dir() or src.suffix == ".py"):
        raise MigrateError(f"source must be a directory or a .py file: {src}")
    dst = options.dst
    if dst is None:
        return
    if dst.exists() and not dst.is_dir():
        raise MigrateError(f"destination exists and is not a directory: {dst}")
    if dst.exists() and any(dst.iterdir()) and not options.force:
        raise MigrateError(f"destination is not empty: {dst} (use --force to replace it)")
    src_dir = (src if src.is_dir() else src.parent).resolve()
    if dst.resolve() == src_dir or src_dir in dst.resolve().parents:
        raise MigrateError(f"destination must be outside the source tree: {dst}")


def migrate_tree(options: Options) -> tuple[Path, list[Result], dict]:
    """Migrate every file under ``options.src``: (root, results, summary). Writes nothing."""
    started = time.perf_counter()
    _check_paths(options)
    rules = RuleSet(load_rules(options.rules_dir), options.select, options.ignore)
    root, python_files, other_files = _walk(options.src)
    try:
        work = [(rel, (root / rel).read_bytes()) for rel in python_files]
    except OSError as exc:
        raise MigrateError(f"cannot read {exc.filename}: {exc.strerror}") from None
    jobs = options.jobs or os.cpu_count() or 1
    with ExitStack() as stack:
        if jobs == 1 or len(work) < _SERIAL_BELOW:
            _init_worker(root, python_files, rules)
            migrated = (_migrate_file(*item) for item in work)
        else:
            pool = stack.enter_context(
                ProcessPoolExecutor(jobs, initializer=_init_worker, initargs=(root, python_files, rules)))
            # submitting everything starts the workers now, before tqdm may start its monitor thread
            migrated = pool.map(_migrate_star, work, chunksize=max(1, len(work) // (jobs * 4)))
        results = list(tqdm(migrated, total=len(work), unit="file", desc="glm-migrate", leave=False,
                            disable=options.quiet or not sys.stderr.isatty()))
    results += [Result(rel, b"", None, None) for rel in other_files]
    reports = [r.report for r in results if r.report is not None]
    summary = summarize(reports, files_changed=sum(r.migrated is not None for r in results),
                        seconds=time.perf_counter() - started)
    return root, results, summary


# -- output ---------------------------------------------------------------------


def unified_diff(results: list[Result]) -> str:
    out = []
    for r in results:
        if r.migrated is None:
            continue
        before = r.original.decode("utf-8", "replace").splitlines(keepends=True)
        after = r.migrated.decode("utf-8", "replace").splitlines(keepends=True)
        path = r.relpath.as_posix()
        out.extend(difflib.unified_diff(before, after, f"a/{path}", f"b/{path}"))
    return "".join(line if line.endswith("\n") else line + "\n" for line in out)


def write_tree(results: list[Result], root: Path, dst: Path, extra: dict[str, str]) -> None:
    """Build DST beside itself and rename it into place: DST is complete or absent.

    ``extra`` maps file names to text written at DST's top (the reports).
    """
    dst.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dst.name}.", dir=dst.parent))
    try:
        shutil.copymode(root, staging)  # mkdtemp makes it private (0700); DST keeps SRC's mode
        for r in results:
            target = staging / r.relpath
            target.parent.mkdir(parents=True, exist_ok=True)
            if r.migrated is not None:
                target.write_bytes(r.migrated)
                shutil.copymode(root / r.relpath, target)
            elif (root / r.relpath).is_symlink():
                target.symlink_to(os.readlink(root / r.relpath))
            else:
                shutil.copy2(root / r.relpath, target)
        for name, text in extra.items():
            (staging / name).write_text(text, encoding="utf-8")
        previous = None
        if dst.exists():  # empty, or --force: moved aside first so DST is never half old, half new
            previous = Path(tempfile.mkdtemp(prefix=f".{dst.name}.old.", dir=dst.parent))
            os.rename(dst, previous)
        os.rename(staging, dst)
        if previous is not None:
            shutil.rmtree(previous)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def write_in_place(results: list[Result], root: Path) -> None:
    """Replace each changed file atomically (a temporary file beside it, then a rename)."""
    for r in results:
        if r.migrated is None:
            continue
        path = root / r.relpath
        fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(r.migrated)
            shutil.copymode(path, temporary)
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise


def run(options: Options) -> int:
    """The whole command: migrate, then diff / check / write as asked. Returns the exit status."""
    root, results, summary = migrate_tree(options)
    reports = [r.report for r in results if r.report is not None]
    rules = {rule.code: rule for rule in load_rules(options.rules_dir)}
    summary["coverage"] = coverage(reports, rules)
    texts = (to_json(summary, reports), to_markdown(summary, reports, rules))
    if options.diff:
        try:
            sys.stdout.write(unified_diff(results))
            sys.stdout.flush()
        except BrokenPipeError:  # `glm-migrate SRC --diff | head`: the reader is gone, stay quiet
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    dry = options.diff or options.check
    report_at = report_paths(options.report) if options.report else None
    try:
        if not dry and options.dst is not None:
            write_tree(results, root, options.dst, {} if report_at else dict(zip(REPORT_NAMES, texts)))
        elif not dry and options.in_place:
            write_in_place(results, root)
            report_at = report_at or (root / REPORT_NAMES[0], root / REPORT_NAMES[1])
        for path, text in zip(report_at or (), texts):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise MigrateError(f"cannot write {exc.filename or ''}: {exc.strerror or exc}") from None
    if not options.quiet:
        s = summary
        where = f" -> {options.dst}" if options.dst and not dry else ""
        print(f"glm-migrate: {s['files_scanned']} files, {s['files_changed']} changed, {s['changes']} changes, "
              f"{s['unconverted']} unconverted ({s['conversion_rate']:.1%}), {s['errors']} errors, "
              f"{s['seconds']:.2f} s{where}", file=sys.stderr)
    return 1 if options.check and summary["files_changed"] else 0
