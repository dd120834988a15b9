"""shim.deepspeed: what the migrated tree calls instead of DeepSpeed, with DeepSpeed installed or not."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import types

import pytest

import shim.deepspeed


def test_config_arguments_are_deepspeeds_flags_and_defaults():
    parser = shim.deepspeed.add_config_arguments(argparse.ArgumentParser())
    assert vars(parser.parse_args([])) == {"deepspeed": False, "deepspeed_config": None,
                                           "deepscale": False, "deepscale_config": None}  # fmt: skip
    args = parser.parse_args(["--deepspeed", "--deepspeed_config", "ds.json"])
    assert args.deepspeed and args.deepspeed_config == "ds.json"


def test_checkpointing_is_shims():
    import shim.checkpointing

    assert shim.deepspeed.checkpointing is shim.checkpointing


def test_the_engine_without_deepspeed_is_a_one_line_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # as if not installed
    with pytest.raises(AttributeError, match=r"^deepspeed.initialize needs DeepSpeed itself \(pip install deepspeed\)"):
        shim.deepspeed.initialize
    assert not hasattr(shim.deepspeed, "zero")


def test_the_engine_is_the_real_deepspeeds_imported_on_first_use(monkeypatch):
    real = types.ModuleType("deepspeed")
    real.initialize = lambda **kwargs: ("engine", kwargs)
    monkeypatch.setitem(sys.modules, "deepspeed", real)
    assert shim.deepspeed.initialize(model=1) == ("engine", {"model": 1})


def test_a_stand_in_pointing_back_here_ends_in_attribute_error(monkeypatch):
    """glm-mock's deepspeed stand-in forwards unknown names to shim.deepspeed: no endless loop."""
    stand_in = types.ModuleType("deepspeed")
    stand_in.__getattr__ = lambda name: getattr(shim.deepspeed, name)
    monkeypatch.setitem(sys.modules, "deepspeed", stand_in)
    with pytest.raises(AttributeError, match="has no attribute 'initialize'"):
        shim.deepspeed.initialize


PROBE = """
import sys
sys.modules["deepspeed"] = None
import shim.deepspeed as deepspeed, shim.distributed as dist
deepspeed.init_distributed(dist_backend="gloo", verbose=False)
deepspeed.init_distributed(dist_backend="gloo", verbose=False)  # a no-op once a group exists
print(dist.get_world_size(), dist.get_rank(), dist.get_backend())
"""


def test_init_distributed_without_a_launcher_makes_a_group_of_one():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    run = subprocess.run([sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["1", "0", "gloo"]
