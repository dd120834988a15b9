"""Upstream's ``--fp16`` path on a real THUDM/GLM checkout, on the CPU (GLM_UPSTREAM; opt-in, as the other e2e tests).

finetune_glm.py on SuperGLUE RTE with ``--fp16`` (every config_tasks/model_blocklm_*.sh passes it): FP16_Module puts
the model in half, fp16/fp16.py's FP16_Optimizer keeps fp32 master weights, fp16/loss_scaler.py scales the loss.
"dynamic" is the scripts' way (upstream's dynamic scaler starts at 2**32: on this tiny run every one of the 8 steps
overflows and is skipped, halving the scale, so it checks the half forward, the overflow check and the skip);
"1024" a static ``--loss-scale`` under which the steps are taken (the scaled backward, the unscale into the fp32
masters, the update, the copy back to half). Unmodified under glm-mock and migrated without it: equal figures.
"""

from __future__ import annotations

import re

import pytest

import harness
from harness import entrypoints, verify


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("scale", ["dynamic", "1024"])
def test_fp16_finetuning_gives_the_originals_figures(trees, tmp_path, scale):
    original, ported = trees
    data = entrypoints.write_data(tmp_path / "data")
    pretrained = entrypoints.pretrained_checkpoint(ported, verify.ported_env(), tmp_path, 900)
    runs = [entrypoints.run_entry("superglue", side, tree, env, data, pretrained, tmp_path, 900, fp16=scale)
            for side, tree, env in (("original", original, harness.mock_env("")),
                                    ("ported", ported, verify.ported_env()))]  # fmt: skip
    comparison = entrypoints.EntryComparison("superglue", *runs, rtol=1e-6)
    print(entrypoints.table(comparison))
    assert comparison.ok, entrypoints.table(comparison)
    assert len(runs[0].figures.items) >= 3
    for run in runs:  # upstream's fp16 path ran: its loss scale is printed with each iteration
        text = run.log.read_text(encoding="utf-8")
        scales = [float(x) for x in re.findall(r"loss scale ([0-9.]+)", text)]
        assert len(scales) == 8, run.log
        if scale == "dynamic":  # every step overflowed at 2**32 and halved it
            assert scales[0] == 2.0**32 and scales[-1] == 2.0**25, scales
        else:
            assert set(scales) == {1024.0}, scales
