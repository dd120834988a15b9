"""TRC003: ``torch.load`` gets ``weights_only=False``, so a GLM checkpoint (an argparse Namespace and
RNG states beside the weights, as upstream's utils.save_checkpoint writes) loads on torch >= 2.6."""

from __future__ import annotations

import argparse
import random

import pytest
import torch

LOADER = """\
import torch


def load_checkpoint(checkpoint_name):
    sd = torch.load(checkpoint_name, map_location='cpu')
    return sd['iteration'], sd['args']
"""


def _glm_checkpoint(path):
    torch.save({"iteration": 3, "module": {"w": torch.ones(2)}, "args": argparse.Namespace(lr=0.25),
                "random_rng_state": random.getstate(), "torch_rng_state": torch.get_rng_state()}, path)  # fmt: skip


def _run(text: str, path):
    namespace: dict = {}
    exec(compile(text, "case.py", "exec"), namespace)
    return namespace["load_checkpoint"](str(path))


def test_migrated_load_reads_a_checkpoint_holding_a_namespace(migrate, tmp_path):
    path = tmp_path / "mp_rank_00_model_states.pt"
    _glm_checkpoint(path)
    with pytest.raises(Exception, match="Weights only load failed"):
        _run(LOADER, path)  # the original, on today's torch
    text, report = migrate(LOADER)
    assert "torch.load(checkpoint_name, map_location='cpu', weights_only=False)" in text
    assert any(c["code"] == "TRC003" for c in report.changes)
    iteration, args = _run(text, path)
    assert iteration == 3 and args.lr == 0.25


@pytest.mark.parametrize("call", ["torch.load(p, weights_only=True)", "torch.load(p, map_location='cpu', weights_only=False)"])
def test_an_explicit_weights_only_is_kept(migrate, call):
    text, report = migrate(f"import torch\n\n\ndef f(p):\n    return {call}\n")
    assert call in text and not any(c["code"] == "TRC003" for c in report.changes)


def test_a_load_through_an_alias_is_rewritten_too(migrate):
    text, _ = migrate("from torch import load as tload\n\n\ndef f(p):\n    return tload(p)\n")
    assert "weights_only=False" in text
