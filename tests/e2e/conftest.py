"""Fixtures for the end-to-end tests: a THUDM/GLM checkout named by GLM_UPSTREAM, and its migration."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from migrate.verify import prepare

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def upstream() -> Path:
    """The checkout GLM_UPSTREAM names; these tests skip without one (CI has no copy)."""
    value = os.environ.get("GLM_UPSTREAM")
    if not value:
        pytest.skip("needs a THUDM/GLM checkout: set GLM_UPSTREAM=/path/to/GLM (writes /root/data/test.json if absent)")
    path = Path(value)
    if not (path / "pretrain_glm.py").is_file():
        pytest.fail(f"GLM_UPSTREAM={value} is not a THUDM/GLM checkout (no pretrain_glm.py)")
    return path.resolve()


@pytest.fixture(scope="session")
def trees(upstream, tmp_path_factory) -> tuple[Path, Path]:
    """(original, ported): a runnable copy of the checkout and its migration."""
    from migrate.mock.selfcheck import DEFAULT_VOCAB

    return prepare(upstream, tmp_path_factory.mktemp("verify"), DEFAULT_VOCAB)
