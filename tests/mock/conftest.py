"""Helpers for the glm-mock tests: run a fixture in a fresh interpreter, with or without the mock."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from migrate.mock import environ as mock_env

from ..conftest import free_port  # noqa: F401  (test modules import it from here too)

FIXTURES = Path(__file__).parent / "fixtures"
REPO = Path(__file__).resolve().parents[2]
SCOPE_VARS = ("PYTHONPATH", mock_env.ENV_ACTIVE, mock_env.ENV_SAVED, "GLM_MOCK_FORCE", "GLM_MOCK_DISABLE")


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment minus anything glm-mock reads, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if k not in SCOPE_VARS}
    env.update(OMP_NUM_THREADS="1", PORT=str(free_port()), **extra)
    return env


def mocked_env(force: str = "", **extra: str) -> dict[str, str]:
    """``clean_env`` with glm-mock on; the children import this checkout's ``migrate`` (last on
    PYTHONPATH), not whichever one is installed."""
    extra["PYTHONPATH"] = os.pathsep.join(p for p in (extra.get("PYTHONPATH"), str(REPO)) if p)
    env = clean_env(**extra)
    return mock_env.apply(env, mock_env.enable_changes(env, force))


def run(cmd: list[str], env: dict[str, str], cwd: Path | None = None, timeout: int = 180):
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def run_fixture(name: str, env: dict[str, str], *args: str, launcher: tuple[str, ...] = ()):
    return run([sys.executable, *launcher, str(FIXTURES / name), *args], env, cwd=FIXTURES)


_ABSENT = object()


def _mockable(name: str) -> bool:
    from migrate.mock.plan import scope_of

    return scope_of(name) is not None


@pytest.fixture
def in_process_mock():
    """An in-process finder test sees no apex/deepspeed modules imported before it, and
    leaves sys.meta_path and sys.modules as it found them. torch is imported first so
    the finder's torch hook (shim.compat.install) never fires inside the test process."""
    import torch

    meta_path = list(sys.meta_path)
    saved = {name: sys.modules.pop(name) for name in list(sys.modules) if _mockable(name)}
    torch_six = vars(torch).get("_six", _ABSENT)  # importing torch._six sets it on torch
    yield
    sys.meta_path[:] = meta_path
    for name in [n for n in sys.modules if _mockable(n)]:
        del sys.modules[name]
    sys.modules.update(saved)
    if torch_six is _ABSENT:
        vars(torch).pop("_six", None)
    else:
        torch._six = torch_six
