"""Upstream's ``--deepspeed`` path on a real THUDM/GLM checkout (GLM_UPSTREAM; opt-in, as the other e2e tests).

Skipped where DeepSpeed is not importable (CI does not install it: it is the optional ``deepspeed`` extra).
pretrain_glm.py (``--save``, then ``--load`` through the engine's own checkpoints) and finetune_glm.py on SuperGLUE
RTE run with ``--deepspeed --deepspeed_config`` (a config in upstream's layout, harness.entrypoints.write_deepspeed_config)
unmodified under glm-mock, and migrated without the mock (apex unimportable; ``deepspeed.initialize`` is DeepSpeed's,
DSP101): the figures each prints are equal.
"""

from __future__ import annotations

import importlib.util

import pytest

import harness
from harness import entrypoints, verify

pytestmark = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                reason="needs DeepSpeed (pip install -e '.[deepspeed]'; DS_BUILD_OPS=0 builds no op)")


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("name", entrypoints.DEEPSPEED_ENTRIES)
def test_deepspeed_engine_gives_the_originals_figures(trees, tmp_path, name):
    original, ported = trees
    data = entrypoints.write_data(tmp_path / "data")
    pretrained = None if name == "resume" else entrypoints.pretrained_checkpoint(ported, verify.ported_env(), tmp_path, 900)
    config = entrypoints.write_deepspeed_config(tmp_path / f"ds-{name}.json", name)
    runs = [entrypoints.run_entry(name, side, tree, env, data, pretrained, tmp_path, 900, deepspeed=config)
            for side, tree, env in (("original", original, harness.mock_env("")),
                                    ("ported", ported, verify.ported_env()))]  # fmt: skip
    comparison = entrypoints.EntryComparison(name, *runs, rtol=1e-6)
    print(entrypoints.table(comparison))
    assert comparison.ok, entrypoints.table(comparison)
    assert len(runs[0].figures.items) >= (2 if name == "resume" else 3)
    for run in runs:  # DeepSpeed's engine ran, on both sides
        assert "DeepSpeed is enabled." in run.log.read_text(encoding="utf-8"), run.log
