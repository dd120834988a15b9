"""Migrate a whole tree: find files, migrate Python files in parallel, write the result atomically.

Where ``-o DST`` puts the result:

- DST absent: the tree is built in a temporary directory beside it and renamed into place at
  the end, so DST is complete or absent.
- DST an empty directory, or one glm-migrate wrote before (``--force``): the tree is built in a
  temporary directory inside DST, then DST's old entries are swapped for the new ones in one short
  step (renames only, Ctrl-C held until it ends). DST itself stays (same inode), so ``-o .``
  and a mount point work.
- SRC one ``.py`` file and DST a path ending in ``.py``: one file, written beside DST and renamed over it.

How glm-migrate knows it wrote a directory: ``DST/.glm-migrate.json`` (``MANIFEST``) lists each
file it wrote there with its size and modification time. ``--force`` replaces DST only when every
entry in DST is listed there and unchanged; a file added or edited since, or no manifest at all,
is a refusal that names it. DST may neither contain SRC nor lie inside it (symbolic links
resolved), whatever the flags.

``--in-place`` writes each changed file beside itself first, then renames them all into place.
"""

from __future__ import annotations

import difflib
import io
import json
import multiprocessing
import os
import shutil
import stat
import sys
import tempfile
import time
import tokenize
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from migrate import interrupt
from migrate.codemod import migrate_source
from migrate.index import ModuleIndex, module_name
from migrate.report import NOT_PYTHON, FileReport, coverage, report_paths, summarize, to_json, to_markdown
from migrate.rules import RuleSet, load_rules

REPORT_NAMES = ("migration_report.json", "MIGRATION_REPORT.md")
MANIFEST = ".glm-migrate.json"  # in every directory glm-migrate writes: what it wrote (see the module's doc)
_TOOL = "glm-migrate"
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


def _init_pool_worker(root: Path, python_files: list[Path], rules: RuleSet) -> None:
    interrupt.ignore()  # Ctrl-C reaches the whole process group; the parent terminates the pool
    _init_worker(root, python_files, rules)


def _migrate_file(relpath: Path, data: bytes) -> Result:
    report = FileReport(relpath.as_posix())
    if b"\0" in data:  # Python refuses NUL bytes in source; this is some other file named .py
        report.error = f"{NOT_PYTHON}: binary data (NUL bytes)"
        return Result(relpath, data, None, report)
    if not any(word in data for word in _worker["triggers"]):
        return Result(relpath, data, None, report)  # no rule can apply: nothing to parse
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
    ``__pycache__`` is left behind: its bytecode belongs to the sources before migration; so is
    the manifest of an earlier run (a new one is written)."""
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
            if rel == Path(MANIFEST):
                continue
            is_python = name.endswith(".py") and not (src / rel).is_symlink()
            (python if is_python else other).append(rel)
    return src, python, other


def _file_output(options: Options) -> bool:
    """Whether the result is one file: SRC is a file and DST names a ``.py`` file, not a directory."""
    dst = options.dst
    return options.src.is_file() and dst is not None and dst.suffix == ".py" and not dst.is_dir()


def _check_paths(options: Options) -> None:
    src = options.src
    if not src.exists():
        raise MigrateError(f"source not found: {src}")
    if not (src.is_dir() or src.suffix == ".py"):
        raise MigrateError(f"source must be a directory or a .py file: {src}")
    dst = options.dst
    if dst is None:
        return
    real_src, real_dst = src.resolve(), dst.resolve()
    what = "source tree" if src.is_dir() else "source file"
    if real_dst == real_src and src.is_file():
        raise MigrateError(f"destination is the source file: {dst} (use --in-place to rewrite it)")
    if real_dst == real_src or real_dst in real_src.parents:
        raise MigrateError(f"destination {dst} contains the {what} {src}: choose a directory outside it")
    if real_src in real_dst.parents:
        raise MigrateError(f"destination {dst} is inside the {what} {src}: choose a directory outside it")
    if _file_output(options):
        if dst.exists() and not dst.is_file():
            raise MigrateError(f"destination exists and is not a file: {dst}")
        if dst.exists() and not options.force:
            raise MigrateError(f"destination exists: {dst} (--force overwrites this file)")
        return
    if dst.exists() and not dst.is_dir():
        raise MigrateError(f"destination exists and is not a directory: {dst}")
    if dst.exists() and any(dst.iterdir()):
        if read_manifest(dst) is None:
            raise MigrateError(f"destination is not empty and glm-migrate did not write it: {dst} "
                               f"(no {MANIFEST}; choose a new or empty directory)")
        foreign = foreign_entries(dst)
        if foreign:
            shown = ", ".join(foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
            raise MigrateError(f"destination {dst} holds what glm-migrate did not write there, or changed since: "
                               f"{shown} (move it away or choose a new directory)")
        if not options.force:
            raise MigrateError(f"destination holds an earlier glm-migrate output: {dst} (--force replaces it)")


# -- the manifest: how glm-migrate knows a directory is its own -----------------


def _entry(path: Path) -> list:
    """What the manifest records of one file: a link's target, or a file's size and mtime."""
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):
        return ["link", os.readlink(path)]
    return ["file", info.st_size, info.st_mtime_ns]


def _entries(top: Path) -> tuple[dict[str, list], set[str]]:
    """(files and links with their manifest entries, directories), relative to ``top``, the manifest left out."""
    files, directories = {}, set()
    for directory, dirnames, filenames in os.walk(top):
        base = Path(directory).relative_to(top)
        for name in list(dirnames):
            if (Path(directory) / name).is_symlink():
                dirnames.remove(name)
                filenames.append(name)
            else:
                directories.add((base / name).as_posix())
        for name in filenames:
            rel = (base / name).as_posix()
            if rel != MANIFEST:
                files[rel] = _entry(Path(directory) / name)
    return files, directories


def read_manifest(directory: Path) -> dict | None:
    """``DST/.glm-migrate.json`` if it is glm-migrate's, else None."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(manifest, dict) or manifest.get("tool") != _TOOL or not isinstance(manifest.get("files"), dict):
        return None
    return manifest


def foreign_entries(directory: Path, besides: Path | None = None) -> list[str]:
    """Paths in ``directory`` its manifest does not list as they are now: added, edited, or replaced
    (everything, when there is no manifest). ``besides``: a directory inside it to leave out."""
    manifest = read_manifest(directory) or {"files": {}}
    listed = manifest["files"]
    parents = {p.as_posix() for rel in listed for p in Path(rel).parents if p != Path(".")}
    files, directories = _entries(directory)
    if besides is not None:
        inside = besides.relative_to(directory).as_posix()
        files = {rel: e for rel, e in files.items() if not rel.startswith(inside + "/")}
        directories = {rel for rel in directories if rel != inside and not rel.startswith(inside + "/")}
    foreign = [rel for rel, entry in files.items() if listed.get(rel) != entry]
    foreign += [rel + "/" for rel in directories if rel not in parents]
    return sorted(foreign)


def _write_manifest(directory: Path, source: Path) -> None:
    files, _ = _entries(directory)
    manifest = {"tool": _TOOL, "source": str(source.resolve()),
                "note": "glm-migrate wrote this directory; --force replaces it only while every entry is as listed",
                "files": dict(sorted(files.items()))}
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")


# -- migrating ------------------------------------------------------------------


def migrate_tree(options: Options) -> tuple[Path, list[Result], dict]:
    """Migrate every file under ``options.src``: (root, results, summary). Writes nothing."""
    started = time.perf_counter()
    try:
        _check_paths(options)
    except OSError as exc:  # e.g. a DST it may not read
        raise MigrateError(f"cannot read {exc.filename}: {exc.strerror}") from None
    rules = RuleSet(load_rules(options.rules_dir), options.select, options.ignore)
    root, python_files, other_files = _walk(options.src)
    try:
        work = [(rel, (root / rel).read_bytes()) for rel in python_files]
    except OSError as exc:
        raise MigrateError(f"cannot read {exc.filename}: {exc.strerror}") from None
    jobs = options.jobs or os.cpu_count() or 1
    progress = dict(total=len(work), unit="file", desc="glm-migrate", leave=False,
                    disable=options.quiet or not sys.stderr.isatty())
    if jobs == 1 or len(work) < _SERIAL_BELOW:
        _init_worker(root, python_files, rules)
        results = list(tqdm((_migrate_file(*item) for item in work), **progress))
    else:
        results = _migrate_in_pool(work, jobs, (root, python_files, rules), progress)
    results += [Result(rel, b"", None, None) for rel in other_files]
    reports = [r.report for r in results if r.report is not None]
    summary = summarize(reports, files_changed=sum(r.migrated is not None for r in results),
                        seconds=time.perf_counter() - started)
    return root, results, summary


def _migrate_in_pool(work: list, jobs: int, initargs: tuple, progress: dict) -> list[Result]:
    """``work`` through ``jobs`` worker processes, in order. The workers ignore Ctrl-C; on any
    exception here (KeyboardInterrupt included) they are terminated and joined before it goes on."""
    pool = None
    try:
        with interrupt.deferred():  # a pool is started whole, and ``pool`` set, before Ctrl-C acts
            pool = multiprocessing.Pool(jobs, initializer=_init_pool_worker, initargs=initargs)
        results = list(tqdm(pool.imap(_migrate_star, work, chunksize=max(1, len(work) // (jobs * 4))),
                            **progress))
        pool.close()
        return results
    finally:
        if pool is not None:
            pool.terminate()  # after close(): the workers are idle; after an error: stop them now
            pool.join()


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


def _fill(staging: Path, results: list[Result], root: Path, extra: dict[str, str]) -> None:
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
    _write_manifest(staging, root)


def write_tree(results: list[Result], root: Path, dst: Path, extra: dict[str, str]) -> None:
    """Write the migrated tree at DST, complete or not at all (see the module's doc).

    ``extra`` maps file names to text written at DST's top (the reports).
    """
    dst = dst.resolve()
    existing = dst.is_dir()
    if not existing:
        dst.parent.mkdir(parents=True, exist_ok=True)
    staging = None
    try:
        with interrupt.deferred():  # the directory is made and ``staging`` set, or neither
            staging = Path(tempfile.mkdtemp(prefix=f".{_TOOL}-tmp.", dir=dst) if existing
                           else tempfile.mkdtemp(prefix=f".{dst.name}.{_TOOL}-tmp.", dir=dst.parent))
        if not existing:
            shutil.copymode(root, staging)  # mkdtemp makes it private (0700); a new DST gets SRC's mode
        _fill(staging, results, root, extra)
        with interrupt.deferred():
            if existing:
                _swap_contents(dst, staging)
            else:
                os.rename(staging, dst)
            staging = None
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)


def _swap_contents(dst: Path, staging: Path) -> None:
    """Replace DST's entries (all glm-migrate's, checked before) by staging's, then remove the old
    ones. Renames within DST's own file system; on a failure half-way, what moved is moved back."""
    foreign = foreign_entries(dst, besides=staging)  # checked before; again, for what came in since
    if foreign:
        raise MigrateError(f"destination {dst} changed while glm-migrate ran: {', '.join(foreign[:5])}; left as it is")
    old = Path(tempfile.mkdtemp(prefix=f".{_TOOL}-old.", dir=dst))
    moved_out, moved_in = [], []
    try:
        for entry in sorted(dst.iterdir()):
            if entry not in (staging, old):
                os.rename(entry, old / entry.name)
                moved_out.append(entry.name)
        new = sorted(staging.iterdir(), key=lambda p: p.name == MANIFEST)  # the manifest last
        for entry in new:
            os.rename(entry, dst / entry.name)
            moved_in.append(entry.name)
    except BaseException:
        for name in reversed(moved_in):
            os.rename(dst / name, staging / name)
        for name in reversed(moved_out):
            os.rename(old / name, dst / name)
        old.rmdir()
        raise
    staging.rmdir()
    shutil.rmtree(old, ignore_errors=True)  # DST is complete; a leftover would be named by the next --force


def _write_atomic(path: Path, data: bytes, mode_from: Path | None = None) -> None:
    """``data`` at ``path`` through a temporary file beside it, renamed over it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with interrupt.deferred():  # small: Ctrl-C waits for it, so no temporary file is left
        fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            if mode_from is not None:
                shutil.copymode(mode_from, temporary)
            else:
                os.chmod(temporary, 0o666 & ~_umask())
            os.replace(temporary, path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_in_place(results: list[Result], root: Path) -> None:
    """Write each changed file beside itself, then rename them all into place (Ctrl-C waits for the renames)."""
    staged: list[tuple[str, Path]] = []
    try:
        for r in results:
            if r.migrated is None:
                continue
            path = root / r.relpath
            with interrupt.deferred():
                fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
                staged.append((temporary, path))
            with os.fdopen(fd, "wb") as handle:
                handle.write(r.migrated)
            shutil.copymode(path, temporary)
        with interrupt.deferred():
            while staged:
                temporary, path = staged[-1]
                os.replace(temporary, path)
                staged.pop()
    finally:
        for temporary, _ in staged:
            Path(temporary).unlink(missing_ok=True)


def _shown(options: Options, relpath: Path) -> str:
    return str(options.src if options.src.is_file() else options.src / relpath)


def run(options: Options) -> int:
    """The whole command: migrate, then diff / check / write as asked. Returns the exit status:
    0 done; 1 ``--check`` found files to change, or a Python file could not be migrated (it does
    not parse or decode, or is not Python: named on stderr, copied unchanged)."""
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
        if not dry and _file_output(options):
            (result,) = results
            _write_atomic(options.dst.resolve(), result.original if result.migrated is None else result.migrated,
                          mode_from=root / result.relpath)
        elif not dry and options.dst is not None:
            write_tree(results, root, options.dst, {} if report_at else dict(zip(REPORT_NAMES, texts)))
        elif not dry and options.in_place:
            write_in_place(results, root)
            report_at = report_at or (root / REPORT_NAMES[0], root / REPORT_NAMES[1])
        for path, text in zip(report_at or (), texts):
            _write_atomic(path, text.encode("utf-8"))
    except OSError as exc:
        raise MigrateError(f"cannot write {exc.filename or ''}: {exc.strerror or exc}") from None
    failed = [r for r in results if r.report is not None and r.report.error]
    if options.check:  # the verdict, file by file: what would change, what could not be checked
        for r in results:
            if r.migrated is not None:
                print(f"{_shown(options, r.relpath)}: would change ({len(r.report.changes)} changes)")
        for r in failed:
            print(f"{_shown(options, r.relpath)}: not checked: {r.report.error}")
    else:
        verb = "not migrated" if dry else "not migrated (copied unchanged)"
        for r in failed:
            print(f"glm-migrate: {_shown(options, r.relpath)}: {verb}: {r.report.error}", file=sys.stderr)
    if not options.quiet:
        s = summary
        where = f" -> {options.dst}" if options.dst and not dry else ""
        print(f"glm-migrate: {s['files_scanned']} files, {s['files_changed']} changed, {s['changes']} changes, "
              f"{s['unconverted']} unconverted ({s['conversion_rate']:.1%}), {s['errors']} not migrated"
              f"{' (%d not Python)' % s['not_python'] if s['not_python'] else ''}, "
              f"{s['seconds']:.2f} s{where}", file=sys.stderr)
    return 1 if failed or (options.check and summary["files_changed"]) else 0
