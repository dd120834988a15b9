"""Shared fixtures for the glm-migrate tests: migrate a snippet inside a small tree."""

from __future__ import annotations

import itertools
import os
import shutil
from pathlib import Path

import pytest

from migrate.codemod import migrate_source
from migrate.index import ModuleIndex, module_name
from migrate.rules import RuleSet, load_rules

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture
def fixtures() -> Path:
    return FIXTURES


@pytest.fixture
def upstream() -> Path:
    """The THUDM/GLM checkout GLM_UPSTREAM names, else one beside the repository (skips when absent)."""
    path = Path(os.environ.get("GLM_UPSTREAM") or Path(__file__).resolve().parents[2].parent / "upstream")
    if not (path / "pretrain_glm.py").exists():
        pytest.skip(f"THUDM/GLM checkout not found at {path}: set GLM_UPSTREAM=/path/to/GLM")
    return path


@pytest.fixture
def migrate(tmp_path):
    """``migrate(source, name="case.py", select=None, ignore=())`` -> (text, FileReport).

    The source is migrated as ``name`` in a fresh tree that also holds the support ``mpu`` package.
    """
    counter = itertools.count()

    def run(source: str, name: str = "case.py", *, select=None, ignore=frozenset(), extra: dict | None = None):
        root = tmp_path / f"tree{next(counter)}"
        shutil.copytree(FIXTURES / "support", root)
        for rel, text in {**(extra or {}), name: source}.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_text(text, encoding="utf-8")
        files = [p.relative_to(root) for p in root.rglob("*.py")]
        rel = Path(name)
        rules = RuleSet(load_rules(), select, ignore)
        return migrate_source(source, name, module_name(rel), rel.name == "__init__.py",
                              ModuleIndex(root, files, rules.reexport_words()), rules)

    return run
