"""Helpers the test directories share; a test module imports them with ``from ..conftest import NAME``
(files that also run as scripts, as ``tests/distributed/conftest.py`` does, import from the package named).

- :func:`free_port`: a free TCP port on 127.0.0.1 for MASTER_PORT / ``torchrun --master_port``; the
  one implementation is ``harness.free_port``, which the harness and the benches use too.
- Whether a tensor is a DTensor, and its local piece: ``shim.is_global`` and ``shim.to_local``.
- The fixture :func:`generate_calls`: what every ``GenerationMixin.generate`` call of a test was given.
- :func:`torchrun`: a command under ``torchrun --standalone`` (a clean interpreter a rank, gloo on CPU), and
  :func:`torchrun_mains`: a command's ``main`` run once per argv on every rank of one launch, each rank's
  output kept (tests/rank_mains.py). Multi-rank runs of the project's commands launch through these, never
  by forking the pytest process (a fork after torch's OpenMP runtime has started can hang).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness import free_port

__all__ = ["free_port", "generate_calls", "torchrun", "torchrun_mains"]

ROOT = Path(__file__).resolve().parents[1]


def torchrun(args: list[str], nproc: int, timeout: float = 280) -> subprocess.CompletedProcess:
    """``python -m torch.distributed.run --standalone --nproc_per_node nproc *args`` from this checkout (one
    OpenMP thread a rank); its output captured as text. A launch that outlives ``timeout`` fails the test."""
    try:
        return subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc), *args],
            capture_output=True, text=True, timeout=timeout,
            env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)})
    except subprocess.TimeoutExpired:
        pytest.fail(f"torchrun with {nproc} ranks did not finish in {timeout} s")


def torchrun_mains(target: str, runs, nproc: int, out_dir, timeout: float = 280,
                   check: bool = True) -> list[list[str]]:
    """``target`` (``module:function``, a command's ``main(argv)``) called once per argv of ``runs`` on each of
    ``nproc`` gloo ranks of ONE torchrun launch (the process group started first, as a launcher script does);
    ``[run][rank]``: what each call printed. A call that raised fails the test with its traceback (``check``
    False: its output holds ``FAILED`` and the traceback, for the caller to report)."""
    out_dir = Path(out_dir)
    spec = out_dir / "rank_mains.json"
    spec.write_text(json.dumps({"target": target, "runs": [list(map(str, argv)) for argv in runs]}))
    done = torchrun([str(ROOT / "tests" / "rank_mains.py"), str(spec)], nproc, timeout)
    logs = [[(out_dir / f"rank{rank}_{index}.txt").read_text() if (out_dir / f"rank{rank}_{index}.txt").exists()
             else "" for rank in range(nproc)] for index in range(len(runs))]
    for index, per_rank in enumerate(logs):
        for rank, log in enumerate(per_rank):
            assert not check or "FAILED\n" not in log, f"run {index}, rank {rank}:\n{log[-4000:]}"
    assert done.returncode == 0, done.stderr[-4000:]
    return logs


@pytest.fixture
def generate_calls(monkeypatch) -> list[dict]:
    """Every ``GenerationMixin.generate`` call's search settings during the test (its keyword arguments, and
    the fields of a ``generation_config`` passed in); the calls go on to the real ``generate``."""
    from transformers import GenerationMixin

    calls, real = [], GenerationMixin.generate

    def spy(self, *args, **kwargs):
        seen = {k: v for k, v in kwargs.items() if k != "generation_config"}
        if kwargs.get("generation_config") is not None:
            seen.update(kwargs["generation_config"].to_diff_dict())
        calls.append(seen)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(GenerationMixin, "generate", spy)
    return calls
