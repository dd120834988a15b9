"""Fixtures for the end-to-end tests: a THUDM/GLM checkout named by GLM_UPSTREAM, and its migration."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from harness import upstream as harness

from harness.verify import prepare

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def upstream() -> Path:
    """The checkout GLM_UPSTREAM names; these tests skip without one (CI has no copy)."""
    value = os.environ.get("GLM_UPSTREAM")
    if not value:
        pytest.skip("needs a THUDM/GLM checkout: set GLM_UPSTREAM=/path/to/GLM (writes the corpus where the checkout reads it, if absent)")
    path = Path(value)
    if not (path / "pretrain_glm.py").is_file():
        pytest.fail(f"GLM_UPSTREAM={value} is not a THUDM/GLM checkout (no pretrain_glm.py)")
    return path.resolve()


@pytest.fixture(scope="session")
def trees(upstream, tmp_path_factory) -> tuple[Path, Path]:
    """(original, ported): a runnable copy of the checkout and its migration."""
    return prepare(upstream, tmp_path_factory.mktemp("verify"), vocab_for(upstream))


def vocab_for(upstream: Path) -> Path | None:
    """None when the checkout ships its vocabulary or $GLM_VOCAB names one; else ../shared/vocab (skip if absent)."""
    if (upstream / harness.VOCAB_CACHE).is_file() or os.environ.get(harness.VOCAB_ENV):
        return None
    shared = REPO.parent / "shared" / "vocab"
    if not (shared / harness.VOCAB_NAME).is_file():
        pytest.skip(f"{upstream} has no {harness.VOCAB_CACHE}: set {harness.VOCAB_ENV}=/path/to/{harness.VOCAB_NAME}")
    return shared
