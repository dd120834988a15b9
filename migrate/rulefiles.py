"""Where the rule tables live, and their TOML parsed: nothing more, so that glm-mock can read its
scopes at start-up cheaply. ``migrate.rules.load_tables`` builds on this and checks every entry."""

from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path

class RuleError(ValueError):
    """A rule table is malformed (or missing)."""


def rules_dir() -> Path:
    """The rules/ directory: beside the packages in a checkout, or under share/ when installed."""
    here = Path(__file__).resolve().parent.parent / "rules"
    if here.is_dir():
        return here
    installed = Path(sys.prefix) / "share" / "glm-migrate" / "rules"
    if installed.is_dir():
        return installed
    raise RuleError(f"rule tables not found (looked in {here} and {installed})")


@lru_cache(maxsize=None)
def parsed_files(directory: str | None = None) -> tuple[tuple[Path, dict], ...]:
    """``(path, its TOML as a dict)`` for every ``*.toml`` in ``directory`` (default: :func:`rules_dir`),
    in name order; not checked beyond TOML syntax."""
    if sys.version_info >= (3, 11):  # imported here: glm-mock's start-up imports this module
        import tomllib
    else:  # pragma: no cover
        import tomli as tomllib

    root = Path(directory) if directory else rules_dir()
    if not root.is_dir():
        raise RuleError(f"rule tables not found: {root} is not a directory")
    files = []
    for path in sorted(root.glob("*.toml")):
        try:
            files.append((path, tomllib.loads(path.read_text(encoding="utf-8"))))
        except tomllib.TOMLDecodeError as exc:
            raise RuleError(f"{path.name}: {exc}") from None
    return tuple(files)
