"""Shared helpers for the glm-migrate tests: migrate a snippet inside a small tree."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from migrate.codemod import migrate_source
from migrate.index import ModuleIndex, module_name
from migrate.rules import RuleSet, load_rules

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parents[2]
UPSTREAM = REPO.parent / "upstream"


def migrate_in_tree(tmp_path: Path, source: str, name: str = "case.py", *, select=None, ignore=frozenset()):
    """Migrate ``source`` as ``name`` in a tree that also holds the support ``mpu`` package."""
    root = tmp_path / "tree"
    if not root.exists():
        shutil.copytree(FIXTURES / "support", root)
    (root / name).write_text(source, encoding="utf-8")
    files = [p.relative_to(root) for p in root.rglob("*.py")]
    rules = RuleSet(load_rules(), select, ignore)
    rel = Path(name)
    return migrate_source(source, name, module_name(rel), rel.name == "__init__.py",
                          ModuleIndex(root, files), rules)


@pytest.fixture
def migrate(tmp_path):
    def run(source: str, name: str = "case.py", **kwargs):
        return migrate_in_tree(tmp_path, source, name, **kwargs)

    return run
