"""Shared fixtures for shim's distributed tests.

Multi-process checks run in forked workers on gloo (127.0.0.1, a free port).
A test module hands all its checks to ONE launch (``launch(CHECKS)``), and each
test then asserts on its own check's outcome on every rank, so a module pays for
one set of processes, not one per test.

Workers are forked from the pytest process when it has no process group; if
something earlier in the session left one behind, the launch runs from a clean
interpreter instead (this file, run as a script), so inherited state never
leaks into the workers.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from harness import free_port  # absolute: this file also runs as a script

LAUNCH_TIMEOUT_S = 150


class CheckResults(dict):
    """``{check name: [traceback or None, per rank]}``."""

    def assert_passed(self, name: str) -> None:
        failures = [f"rank {rank}:\n{tb}" for rank, tb in enumerate(self[name]) if tb is not None]
        assert not failures, "\n".join(failures)


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


def _fork_and_run(checks: dict, world_size: int) -> dict:
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
    return {name: [results[name] for results in per_rank] for name in checks}


def _run_in_clean_interpreter(checks: dict, world_size: int) -> dict:
    (module_file,) = {sys.modules[check.__module__].__file__ for check in checks.values()}
    names = [f"{key}={check.__name__}" for key, check in checks.items()]
    try:
        done = subprocess.run(
            [sys.executable, __file__, module_file, str(world_size), *names],
            capture_output=True, text=True, timeout=LAUNCH_TIMEOUT_S + 60,
        )
    except subprocess.TimeoutExpired:
        return {name: [f"clean launch did not finish in {LAUNCH_TIMEOUT_S + 60} s"] * world_size for name in checks}
    if done.returncode != 0:
        return {name: [f"clean launch failed:\n{done.stderr}"] * world_size for name in checks}
    return json.loads(done.stdout.strip().splitlines()[-1])


def run_checks(checks: dict, world_size: int = 2) -> CheckResults:
    """Run every ``check()`` (module-level functions) on ``world_size`` gloo ranks, in one launch.

    Checks run in the given order on all ranks; each may call collectives and
    ``setup_layout``. A crash or hang fails every check with the reason.
    """
    if dist.is_initialized():
        return CheckResults(_run_in_clean_interpreter(checks, world_size))
    return CheckResults(_fork_and_run(checks, world_size))


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
    sdist.reset_layout()
    dist.destroy_process_group()


if __name__ == "__main__":  # the clean interpreter: conftest.py TEST_FILE WORLD_SIZE KEY=FUNCTION...
    # the checkout's root, as pytest's pythonpath puts it: a test module's ``tests.distributed...`` imports
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    test_file, world = sys.argv[1], int(sys.argv[2])
    spec = importlib.util.spec_from_file_location("dist_checks", test_file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    pairs = (arg.split("=", 1) for arg in sys.argv[3:])
    print(json.dumps(_fork_and_run({key: getattr(module, name) for key, name in pairs}, world)))
