"""Shared fixtures for shim's distributed tests.

Multi-process checks run in forked workers on gloo (127.0.0.1, a free port).
A test module hands all its checks to ONE launch (``run_checks``), and each test
then asserts on its own check's outcome on every rank, so a module pays for
one process group, not one per test.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
import time
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

LAUNCH_TIMEOUT_S = 150


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world_size, port, checks, out_dir):
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world_size),
    )
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    results = {}
    for name, check in checks.items():
        try:
            check()
            results[name] = None
        except Exception:  # reported per check, per rank, by the test that owns it
            results[name] = traceback.format_exc()
    with open(os.path.join(out_dir, f"{rank}.json"), "w") as f:
        json.dump(results, f)
    dist.destroy_process_group()


class CheckResults(dict):
    """``{check name: [traceback or None, per rank]}``."""

    def assert_passed(self, name: str) -> None:
        failures = [f"rank {rank}:\n{tb}" for rank, tb in enumerate(self[name]) if tb is not None]
        assert not failures, "\n".join(failures)


def run_checks(checks: dict, world_size: int = 2) -> CheckResults:
    """Run every ``check()`` on ``world_size`` gloo ranks, in one launch.

    Checks run in the given order on all ranks; each may call collectives and
    ``setup_dist_util``. A crash or hang fails every check with the reason.
    """
    assert not dist.is_initialized(), "a test left a process group behind; forked workers would inherit it"
    with tempfile.TemporaryDirectory() as out_dir:
        context = mp.start_processes(
            _worker, args=(world_size, free_port(), checks, out_dir), nprocs=world_size,
            start_method="fork", join=False,
        )
        deadline = time.monotonic() + LAUNCH_TIMEOUT_S
        failure = None
        try:
            while not context.join(timeout=max(0.0, deadline - time.monotonic())):
                if time.monotonic() >= deadline:
                    failure = f"workers did not finish within {LAUNCH_TIMEOUT_S} s"
                    break
        except Exception as exc:  # a worker died outside the checks
            failure = f"worker failed: {exc}"
        finally:
            for process in context.processes:
                if process.is_alive():
                    process.kill()
        per_rank = []
        for rank in range(world_size):
            path = os.path.join(out_dir, f"{rank}.json")
            if failure is None and os.path.exists(path):
                with open(path) as f:
                    per_rank.append(json.load(f))
            else:
                per_rank.append({name: failure or "no result written" for name in checks})
    return CheckResults({name: [results[name] for results in per_rank] for name in checks})


@pytest.fixture(scope="session")
def launch():
    """``launch(checks, world_size=2) -> CheckResults``: see :func:`run_checks`."""
    return run_checks


@pytest.fixture
def world_of_one():
    """An initialised world of one (no launcher); torn down so later forks start clean."""
    import shim.distributed as sdist

    sdist.init_process_group("gloo")
    yield
    sdist.reset_dist_util()
    dist.destroy_process_group()
