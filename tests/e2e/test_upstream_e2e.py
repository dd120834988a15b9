"""Against a real THUDM/GLM checkout (GLM_UPSTREAM=/path/to/GLM; skipped without one, as in CI).

The migrated tree trains with the original's losses (the original under glm-mock), and its
checkpoints cross to glm_port and back with the same logits. Slow: minutes on two cores.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import harness
from harness import verify

PROBE = Path(__file__).with_name("checkpoint_probe.py")


def test_migrated_tree_passes_the_static_checks(trees):
    original, ported = trees
    assert verify.static_problems(original, ported) == []


@pytest.mark.timeout(1200)
@pytest.mark.parametrize("mode", list(verify.MODES))
def test_migrated_pretrain_logs_the_originals_losses(trees, mode):
    original, ported = trees
    iters = 5
    theirs = verify.pretrain(original, harness.mock_env(""), mode, iters, 900, ["pretrain_glm.py"])
    ours = verify.pretrain(ported, verify.ported_env(), mode, iters, 900, verify.PORTED_LAUNCH)
    comparison = verify.Comparison(mode, theirs, ours, rtol=1e-4)
    assert len(ours.losses) == iters and comparison.ok, verify.table(comparison)


@pytest.mark.timeout(900)
def test_checkpoints_cross_between_the_migrated_tree_and_glm_port(trees, tmp_path):
    _, ported = trees
    save = tmp_path / "save"
    run = verify.pretrain(ported, verify.ported_env(), "1", 2, 600, verify.PORTED_LAUNCH,
                          extra=["--save", str(save), "--save-interval", "2"])  # fmt: skip
    assert run.code == 0, run.log.read_text()[-3000:]
    [checkpoint] = save.glob("*/2/mp_rank_00_model_states.pt")  # upstream appends the experiment name
    command = [sys.executable, str(PROBE), str(ported), str(checkpoint), str(tmp_path)]
    probe = subprocess.run(command, cwd=ported, env=verify.ported_env(), capture_output=True, text=True, timeout=600)
    lines = [line for line in probe.stdout.splitlines() if line.startswith(("PASS", "FAIL"))]
    assert probe.returncode == 0 and len(lines) == 2, probe.stdout[-2000:] + probe.stderr[-2000:]


@pytest.mark.timeout(900)
def test_verify_command_end_to_end(upstream, tmp_path, capsys):
    argv = [str(upstream), "--iters", "3", "--modes", "1", "--no-mpu-tests", "--workdir", str(tmp_path)]
    assert verify.main(argv) == 0
    out = capsys.readouterr().out
    assert "all static checks hold" in out and "1 of 1 modes match;" in out
