"""Megatron's own mpu tests, from a THUDM/GLM checkout, run against shim.mpu (slow; opt-in).

``mpu/tests/test_initialize.py`` and ``test_cross_entropy.py`` import ``mpu``; here that name is
shim.mpu (a two-line alias package), with ``shim.compat`` installed for their ``torch.cuda`` calls,
under ``torchrun --nproc_per_node 2`` on gloo. The other upstream test files reach into private
helpers (``_initialize_affine_weight``, ``_set_cuda_rng_state``...) that shim.mpu does not have;
tests/distributed/test_mpu.py covers the same ground through the public surface.
Runs only with GLM_UPSTREAM=/path/to/GLM set.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from ..conftest import free_port

UPSTREAM = os.environ.get("GLM_UPSTREAM", "")
TESTS = os.path.join(UPSTREAM, "mpu", "tests")

pytestmark = pytest.mark.skipif(
    not os.path.isdir(TESTS), reason="needs a THUDM/GLM checkout: set GLM_UPSTREAM=/path/to/GLM"
)

ALIAS = textwrap.dedent(
    """\
    import sys
    import shim.compat
    shim.compat.install()  # the tests call torch.cuda.* and ask for nccl
    import shim.mpu
    from shim.mpu import *
    for name in ("cross_entropy", "data", "grads", "initialize", "layers", "mappings", "utils"):
        sys.modules["mpu." + name] = getattr(shim.mpu, name)
    """
)


@pytest.mark.parametrize("script", ["test_initialize.py", "test_cross_entropy.py"])
def test_megatron_mpu_test_passes_on_shim_mpu(script, tmp_path):
    (tmp_path / "mpu").mkdir()
    (tmp_path / "mpu" / "__init__.py").write_text(ALIAS)
    # the caller's PYTHONPATH stays last, so a checkout on it is the shim under test
    path = [str(tmp_path), TESTS] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
         "--master_port", str(free_port()), os.path.join(TESTS, script)],
        cwd=TESTS, env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "passed the test" in done.stdout
