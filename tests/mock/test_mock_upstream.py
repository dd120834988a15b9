"""The unmodified THUDM/GLM checkout under the mock (slow: minutes). Runs only with GLM_UPSTREAM set."""

import os
from pathlib import Path

import pytest

from harness import selfcheck

UPSTREAM = os.environ.get("GLM_UPSTREAM", "")

pytestmark = pytest.mark.skipif(
    not (UPSTREAM and (Path(UPSTREAM) / "pretrain_glm.py").is_file()),
    reason="needs a THUDM/GLM checkout: set GLM_UPSTREAM=/path/to/GLM (writes the corpus where the checkout reads it, if absent)",
)


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("nproc", [1, 2])
def test_upstream_pretrain_trains_with_falling_losses(nproc, tmp_path):
    assert selfcheck.main([UPSTREAM, "--nproc", str(nproc), "--no-mpu-tests", "--workdir", str(tmp_path)]) == 0


@pytest.mark.timeout(1800)
def test_upstream_mpu_tests_pass(tmp_path):
    assert selfcheck.main([UPSTREAM, "--nproc", "--workdir", str(tmp_path)]) == 0
