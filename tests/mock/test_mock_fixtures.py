"""Fixtures in upstream's shapes: failing without the mock, passing with it (fresh interpreters)."""

import importlib.util
import sys

import pytest

from .conftest import clean_env, mocked_env, run, run_fixture

# script -> the error it fails with when nothing is mocked
CASES = {
    "apex_fused.py": "ModuleNotFoundError: No module named 'apex'",
    "six_inf.py": "ModuleNotFoundError: No module named 'torch._six'",
    "cuda_tensors.py": "",  # which error depends on how torch was built
    "ddp_device_ids.py": "",
}


def _results(env) -> dict[str, str]:
    proc = run_fixture("run_each.py", env, *CASES)
    lines = [line.split(" ", 2) for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert [script for _, script, _ in lines] == list(CASES), proc.stderr[-3000:]
    return {script: result for _, script, result in lines}


@pytest.fixture(scope="module")
def without_mock():
    return _results(clean_env())


@pytest.fixture(scope="module")
def with_mock():
    return _results(mocked_env())


@pytest.mark.parametrize("script", CASES)
def test_fails_without_mock(script, without_mock):
    assert without_mock[script] != "ok"
    assert without_mock[script].startswith(CASES[script])


@pytest.mark.parametrize("script", CASES)
def test_passes_with_mock(script, with_mock):
    assert with_mock[script] == "ok"


def test_deepspeed_parts_glm_uses_without_deepspeed_installed():
    without = run_fixture("without_deepspeed.py", clean_env(), "deepspeed_startup.py")
    assert without.returncode != 0 and "No module named 'deepspeed'" in without.stderr
    mocked = run_fixture("without_deepspeed.py", mocked_env(), "deepspeed_startup.py")
    assert mocked.returncode == 0, mocked.stderr[-3000:]
    assert "OK deepspeed_startup deepspeed" in mocked.stdout


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed here")
def test_installed_deepspeed_wins_unless_forced():
    probe = "import deepspeed; print(type(deepspeed).__name__)"
    real = run([sys.executable, "-c", probe], mocked_env())
    assert real.returncode == 0 and real.stdout.splitlines()[-1] == "module", real.stderr[-3000:]
    forced = run([sys.executable, "-c", probe + "; deepspeed.initialize(model=None)"], mocked_env(force="deepspeed"))
    assert forced.stdout == "StandIn\n"
    last = forced.stderr.strip().splitlines()[-1]
    assert last.startswith("AttributeError: deepspeed.initialize is not covered by glm-mock: [DSP101]")
    assert "install DeepSpeed" in last
