"""Under a real launcher: ``torchrun --nproc_per_node 2`` on gloo, process group started by shim."""

import os
import subprocess
import sys

from ..conftest import free_port

SCRIPT = os.path.join(os.path.dirname(__file__), "torchrun_script.py")


def test_setup_layout_under_torchrun():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(  # torchrun itself, as the module its console script runs
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1", "--master_port", str(free_port()),
         SCRIPT],
        capture_output=True, text=True, timeout=150, env=env,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "torchrun ok" in done.stdout


def test_groups_never_destroyed_are_freed_before_interpreter_shutdown():
    done = subprocess.run([sys.executable, os.path.join(os.path.dirname(__file__), "exit_without_destroy.py")],
                          capture_output=True, text=True, timeout=60, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert "no gloo threads at exit" in done.stdout
