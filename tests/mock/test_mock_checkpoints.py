"""GLM's checkpoints (an argparse Namespace and RNG states beside the weights) load under the mock.

torch >= 2.6 defaults ``torch.load`` to ``weights_only=True``, which refuses them; the mock (through
``shim.compat.install()``) restores the old default for calls that do not say (trust decision:
``shim.compat.serialization``, docs/upstream.md)."""

from __future__ import annotations

import argparse

import pytest
import torch

import shim.compat
from shim.compat.serialization import trusting_load

from .conftest import clean_env, mocked_env, run_fixture


def _save_namespace_checkpoint(path):
    torch.save({"args": argparse.Namespace(lr=0.5), "torch_rng_state": torch.get_rng_state(),
                "module": {"w": torch.ones(2)}}, path)  # fmt: skip


@pytest.mark.parametrize("how", ["default", "cpu"])
def test_upstream_checkpoint_loads_under_the_mock(tmp_path, how):
    args = [str(tmp_path / "ck.pt")] + (["cpu"] if how == "cpu" else [])
    plain = run_fixture("namespace_checkpoint.py", clean_env(), *args)
    assert plain.returncode == 1 and "FAILED UnpicklingError" in plain.stdout, plain.stdout + plain.stderr
    mocked = run_fixture("namespace_checkpoint.py", mocked_env(), *args)
    assert mocked.returncode == 0 and "LOADED 7 0.001" in mocked.stdout, mocked.stdout + mocked.stderr


def test_torch_force_weights_only_load_still_refuses_under_the_mock(tmp_path):
    mocked = run_fixture("namespace_checkpoint.py", mocked_env(TORCH_FORCE_WEIGHTS_ONLY_LOAD="1"), str(tmp_path / "ck.pt"))
    assert mocked.returncode == 1 and "FAILED UnpicklingError" in mocked.stdout, mocked.stdout + mocked.stderr


def test_install_sets_the_old_default_and_uninstall_puts_torch_load_back(tmp_path):
    path = tmp_path / "ck.pt"
    _save_namespace_checkpoint(path)
    original = torch.load
    with pytest.raises(Exception, match="Weights only load failed"):
        torch.load(path)
    with shim.compat.installed():
        assert torch.load(path)["args"].lr == 0.5
        assert "torch.load" in shim.compat.planned_changes()
    assert torch.load is original


def test_trusting_load_keeps_an_explicit_choice(tmp_path):
    path = tmp_path / "ck.pt"
    _save_namespace_checkpoint(path)
    load = trusting_load(torch.load)
    assert load(path, map_location="cpu")["args"].lr == 0.5
    assert load(path, weights_only=None)["args"].lr == 0.5  # None: "not said", as torch reads it
    with pytest.raises(Exception, match="Weights only load failed"):
        load(path, weights_only=True)
