"""What every glm_port command that writes checks and does before and while writing: one rule, one place.

- ``check_apart(out, inputs)``: an output may neither be an input, nor contain one, nor lie inside one
  (symbolic links resolved), whatever the flags. ``--overwrite`` replaces an earlier output; it never
  deletes what the command reads (``glm-merge ckpt/4 ckpt --overwrite`` would have replaced the whole
  checkpoint with the merged model). glm-migrate holds its DST to the same rule (``migrate/runner.py``).
- ``check_directory_output`` / ``check_file_output``: an output path that cannot be written (an existing
  file where a directory goes, a directory where a file goes, a parent that is a file or not writable)
  is refused before any work, not found at the first save after hours of training.
- ``work_directory`` / ``publish``: a directory output is assembled in a hidden directory beside it and
  renamed into place whole, its files given the modes the umask gives (``follow_umask``: safetensors
  writes its files 0600, through a temporary file); ``save_safetensors`` turns a failed write (a full
  disk) into one line naming the file.

Every error is an ``OutputError`` (a ``ValueError``): one line, which the commands print with exit status 2.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterable
from pathlib import Path

__all__ = ["OutputError", "check_apart", "check_directory_output", "check_file_output", "follow_umask",
           "work_directory", "publish", "discard", "save_safetensors", "umask"]


class OutputError(ValueError):
    """An output that would clobber an input or cannot be written: one line, exit status 2."""


def _real(path) -> Path:
    return Path(path).expanduser().resolve()


def check_apart(out, inputs: Iterable[tuple[str, object]], out_flag: str = "OUT") -> None:
    """Refuse ``out`` when it is one of ``inputs`` (``(flag, path)`` pairs; a None path is skipped), contains
    one, or lies inside one. Paths are compared with symbolic links resolved; the paths need not exist."""
    given = Path(out).expanduser().absolute()
    # The link itself is what a publish replaces: OUT a symbolic link inside an input is inside it too.
    places = {_real(out), given.parent.resolve() / given.name}
    for flag, source in inputs:
        if source is None:
            continue
        real_in = _real(source)
        if real_in in places:
            raise OutputError(f"{out_flag} {out} is the input {flag} {source}: the output cannot be the input "
                              f"(choose another path)")
        if any(place in real_in.parents for place in places):
            raise OutputError(f"{out_flag} {out} contains the input {flag} {source}: writing it would delete "
                              f"the input (choose a path outside it)")
        if any(real_in in place.parents for place in places):
            raise OutputError(f"{out_flag} {out} is inside the input {flag} {source}: choose a path outside it")


def _check_parent(path: Path, flag: str) -> None:
    """The nearest existing ancestor of ``path`` must be a directory this process can create entries in."""
    parent = path.expanduser().absolute().parent
    while not parent.exists() and not parent.is_symlink():
        parent = parent.parent
    if not parent.is_dir():
        raise OutputError(f"{flag} {path}: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise OutputError(f"{flag} {path}: cannot write in {parent} (permission denied)")


def check_directory_output(out, flag: str = "OUT", *, overwrite: bool | None = None,
                           overwrite_flag: str | None = "--overwrite") -> None:
    """``out`` can become a directory: absent, or a directory (empty unless ``overwrite``; ``overwrite=None``:
    the command adds to an existing directory, so any is fine), in a writable place. ``overwrite_flag``: the
    flag the refusal of a non-empty one names (None: the command has none)."""
    out = Path(out)
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            raise OutputError(f"{flag} {out}: exists and is not a directory")
        if overwrite is False and any(out.iterdir()):
            hint = f"pass {overwrite_flag} to replace it" if overwrite_flag else "choose a new or empty directory"
            raise OutputError(f"{flag} {out}: exists and is not empty ({hint})")
        if not os.access(out, os.W_OK | os.X_OK):
            raise OutputError(f"{flag} {out}: cannot write in it (permission denied)")
        return
    _check_parent(out, flag)


def check_file_output(path, flag: str = "output") -> None:
    """``path`` can be written as a file: absent or a file, in a writable place."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{flag} {path}: is a directory, not a file")
    _check_parent(path, flag)


def umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def follow_umask(top) -> None:
    """Give ``top`` and everything under it the modes a plain ``open``/``mkdir`` would have: files
    ``0o666 & ~umask``, directories ``0o777 & ~umask`` (``mkdtemp`` and safetensors' writer make them private)."""
    mask = umask()
    top = Path(top)
    entries = [top] if not top.is_dir() else [top, *top.rglob("*")]
    for entry in entries:
        if entry.is_symlink():
            continue
        entry.chmod((0o777 if entry.is_dir() else 0o666) & ~mask)


def work_directory(out) -> Path:
    """A fresh hidden directory beside ``out`` where the output is assembled (``publish`` puts it in place;
    ``discard`` removes it after a failure)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))


def publish(work, out) -> Path:
    """Put the finished ``work`` directory at ``out``, its files' modes as the umask gives; the old ``out``,
    if any, goes only once the new one is there. An empty ``out`` directory is replaced."""
    work, out = Path(work), Path(out)
    follow_umask(work)
    if out.is_dir() and not out.is_symlink() and any(out.iterdir()):
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.replace(out, old / out.name)
        os.replace(work, out)
        shutil.rmtree(old, ignore_errors=True)
    else:
        if out.is_dir() and not out.is_symlink():
            out.rmdir()
        os.replace(work, out)
    return out


def discard(work) -> None:
    """Remove a work directory a failed write left (nothing when it was published)."""
    shutil.rmtree(work, ignore_errors=True)


def save_safetensors(tensors: dict, path, metadata: dict | None = None, shown=None) -> None:
    """``safetensors.torch.save_file``, with a failed write (a full disk, a quota) as one ``OutputError``
    naming the file (``shown``: the name to give it, e.g. where it was to be published, when ``path`` is in a
    work directory): safetensors reports it as ``SafetensorError("Error while serializing: I/O error: ...")``."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    try:
        save_file(tensors, str(path), metadata=metadata)
    except (SafetensorError, OSError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        reason = reason.removeprefix("Error while serializing: ").removeprefix("I/O error: ")
        raise OutputError(f"{shown or path}: could not be written ({reason})") from None
