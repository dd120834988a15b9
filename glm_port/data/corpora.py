"""Upstream's corpus names (``--train-data bert-large wikibook ...``) resolved through a mapping the user writes.

Upstream hard-codes each named corpus's path in ``data_utils/corpora.py``; here a TOML file names them:

    # ~/.config/glm-migrate/corpora.toml, or the file $GLM_CORPORA names
    bert-large = "/data/bert/formatted_one_article_per_line_large.jsonl"
    wikibook = "/data/wikibook"              # a directory: its .json/.jsonl/.txt files, sorted
    pile = ["/data/pile/00.jsonl", "/data/pile/01.jsonl"]

Relative paths are read from the TOML file's directory. A ``[corpora]`` table may hold the names instead.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

CORPORA_ENV = "GLM_CORPORA"
CORPUS_SUFFIXES = (".json", ".jsonl", ".txt")


def corpora_file() -> Path:
    """Where the name -> path mapping is read from: ``$GLM_CORPORA``, else the user's config directory."""
    if os.environ.get(CORPORA_ENV):
        return Path(os.environ[CORPORA_ENV]).expanduser()
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return config / "glm-migrate" / "corpora.toml"


def _files(path: Path, what: str) -> list[Path]:
    if path.is_file():
        return [path]
    files = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in CORPUS_SUFFIXES)
    if not files:
        raise ValueError(f"{what}: directory {path} holds no {'/'.join(CORPUS_SUFFIXES)} files")
    return files


def resolve_corpus(name_or_path: str) -> list[Path]:
    """The files of one ``--train-data`` entry: an existing file or directory, else a corpus name in the
    mapping. Raises ValueError with one line naming what was looked for."""
    path = Path(name_or_path).expanduser()
    if path.exists():
        return _files(path, name_or_path)
    mapping_file = corpora_file()
    looks_like_path = os.sep in name_or_path or path.suffix in CORPUS_SUFFIXES
    if looks_like_path:
        raise ValueError(f"{name_or_path}: no such file or directory")
    if not mapping_file.is_file():
        raise ValueError(f"{name_or_path}: no such file, and no corpus mapping at {mapping_file} to look the name "
                         f"up in (write it, or set {CORPORA_ENV}, with lines like {name_or_path} = \"/path/to/data\")")
    try:
        mapping = tomllib.loads(mapping_file.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ValueError(f"{mapping_file}: not valid TOML ({error})") from None
    table = mapping.get("corpora", mapping) if isinstance(mapping.get("corpora"), dict) else mapping
    if name_or_path not in table:
        names = ", ".join(sorted(k for k, v in table.items() if not isinstance(v, dict))) or "none"
        raise ValueError(f"{name_or_path}: no such file, and {mapping_file} names no such corpus (it names: {names})")
    entries = table[name_or_path]
    entries = [entries] if isinstance(entries, str) else entries
    if not isinstance(entries, list) or not all(isinstance(e, str) for e in entries) or not entries:
        raise ValueError(f"{mapping_file}: {name_or_path} must be a path or a list of paths")
    files = []
    for entry in entries:
        target = Path(entry).expanduser()
        if not target.is_absolute():
            target = mapping_file.parent / target
        if not target.exists():
            raise ValueError(f"{name_or_path}: {mapping_file} maps it to {target}, which does not exist")
        files += _files(target, name_or_path)
    return files


def resolve_corpora(entries: list[str] | None) -> list[Path] | None:
    """All files of a ``--train-data``-style list, in order (None stays None: the embedded corpus)."""
    if entries is None:
        return None
    return [file for entry in entries for file in resolve_corpus(entry)]
