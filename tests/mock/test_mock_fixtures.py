"""Fixtures in upstream's shapes, each in a fresh interpreter: failing without the mock, passing with it."""

import sys

import pytest

from .conftest import clean_env, mocked_env, run, run_fixture

CASES = [
    ("apex_fused.py", "No module named 'apex'"),
    ("cuda_tensors.py", "Error"),  # which error depends on the torch build
    ("six_inf.py", "No module named 'torch._six'"),
    ("ddp_device_ids.py", "Error"),
]


@pytest.mark.parametrize("script, error", CASES)
def test_fails_without_mock(script, error):
    proc = run_fixture(script, clean_env())
    assert proc.returncode != 0 and "OK" not in proc.stdout
    assert error in proc.stderr


@pytest.mark.parametrize("script", [c[0] for c in CASES])
def test_passes_with_mock(script):
    proc = run_fixture(script, mocked_env())
    assert proc.returncode == 0, proc.stderr
    assert f"OK {script[:-3]}" in proc.stdout


def test_deepspeed_parts_glm_uses_without_deepspeed_installed():
    without = run_fixture("without_deepspeed.py", clean_env(), "deepspeed_startup.py")
    assert without.returncode != 0 and "No module named 'deepspeed'" in without.stderr
    mocked = run_fixture("without_deepspeed.py", mocked_env(), "deepspeed_startup.py")
    assert mocked.returncode == 0, mocked.stderr
    assert "OK deepspeed_startup deepspeed" in mocked.stdout


def test_deepspeed_engine_is_refused_with_an_error_naming_deepspeed():
    code = "import deepspeed; deepspeed.initialize(model=None)"
    proc = run([sys.executable, "-c", code], mocked_env(force="deepspeed"))
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("AttributeError: deepspeed.initialize is not covered by glm-mock: [DSP101]")
    assert "install DeepSpeed" in last


def test_installed_deepspeed_wins_unless_forced():
    code = "import deepspeed, sys; print(type(deepspeed).__name__, deepspeed.__name__)"
    real = run([sys.executable, "-c", code], mocked_env())
    assert real.returncode == 0 and real.stdout.split()[0] == "module", real.stderr
    forced = run([sys.executable, "-c", code], mocked_env(force="deepspeed"))
    assert forced.returncode == 0 and forced.stdout.split() == ["StandIn", "deepspeed"], forced.stderr
