"""Child processes inherit the mock: torchrun, DeepSpeed launcher and multiprocessing spawn workers."""

import importlib.util
import re

import pytest

from .conftest import clean_env, free_port, mocked_env, run_fixture

TORCHRUN = ("-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1")


def test_torchrun_workers_run_a_cuda_era_data_parallel_step():
    launcher = (*TORCHRUN, "--master_port", str(free_port()))
    without = run_fixture("allreduce_dp.py", clean_env(), launcher=launcher)
    assert without.returncode != 0
    proc = run_fixture("allreduce_dp.py", mocked_env(), launcher=(*TORCHRUN, "--master_port", str(free_port())))
    assert proc.returncode == 0, proc.stderr[-3000:]
    # the two workers share one pipe: their lines can run together, so match, do not split
    assert sorted(re.findall(r"OK allreduce_dp rank (\d+)", proc.stdout)) == ["0", "1"]


def test_spawned_worker_sees_the_mock():
    proc = run_fixture("spawn_child.py", mocked_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("OK spawn_child shim.")


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed here")
def test_deepspeed_launcher_workers_see_the_mock():
    launcher = ("-m", "deepspeed.launcher.runner", "--num_gpus", "2", "--master_port", str(free_port()))
    proc = run_fixture("allreduce_dp.py", mocked_env(), launcher=launcher)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(re.findall(r"OK allreduce_dp rank (\d+)", proc.stdout)) == ["0", "1"]
