"""glm-migrate --verify's parts, on trees and logs written here (no THUDM/GLM checkout needed)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harness import verify
from migrate.cli import main as cli_main

# A stand-in pretrain_glm.py: upstream's log format, losses that depend on the flags verify passes.
FAKE_PRETRAIN = textwrap.dedent('''\
    import os, sys
    flags = {name: value for name, value in zip(sys.argv[1:], sys.argv[2:]) if name.startswith("--")}
    if flags.get("--hidden-dropout") != "0" or flags.get("--attention-dropout") != "0" or flags["--seed"] != "1234":
        sys.exit("dropout must be off and the seed 1234")
    import apex  # fails under harness.without, as the migrated tree must not need it
''')
FAKE_LOSSES = textwrap.dedent('''\
    mp = int(flags["--model-parallel-size"])
    if os.environ.get("RANK", "0") == "0":
        for i in range(1, int(flags["--train-iters"]) + 1):
            print(f" iteration {i:8d}/{flags['--train-iters']:>8} | elapsed time per iteration (ms): {100.0 + i:.1f} |"
                  f" learning rate 1.000E-03 | lm loss {10.5 - i / 10 - mp / 1000:.6E} |")
''')


def fake_tree(root: Path, *, needs_apex: bool) -> Path:
    root.mkdir()
    body = FAKE_PRETRAIN if needs_apex else FAKE_PRETRAIN.replace("import apex", "import json")
    (root / "pretrain_glm.py").write_text(body + FAKE_LOSSES, encoding="utf-8")
    return root


def test_pretrain_reads_losses_and_times_from_upstreams_log(tmp_path):
    tree = fake_tree(tmp_path / "GLM", needs_apex=False)
    run = verify.pretrain(tree, verify.ported_env(), "1", 4, 120, ["pretrain_glm.py"])
    assert run.code == 0, run.log.read_text()
    assert run.losses == [10.399, 10.299, 10.199, 10.099]
    assert run.ms_per_iter == [101.0, 102.0, 103.0, 104.0] and run.median_ms == 103.0


def test_tensor_parallel_mode_runs_two_ranks_under_torchrun_without_apex(tmp_path):
    tree = fake_tree(tmp_path / "GLM", needs_apex=False)
    run = verify.pretrain(tree, verify.ported_env(), "tp2", 2, 300, verify.PORTED_LAUNCH)
    assert run.code == 0, run.log.read_text()
    assert run.losses == [10.398, 10.298]  # --model-parallel-size 2 reached the script; rank 0 alone prints


def test_migrated_tree_runs_with_apex_unimportable(tmp_path):
    tree = fake_tree(tmp_path / "GLM", needs_apex=True)
    run = verify.pretrain(tree, verify.ported_env(), "1", 2, 120, verify.PORTED_LAUNCH)
    assert run.code != 0 and run.losses == []
    assert "ModuleNotFoundError: import of apex halted" in run.log.read_text()


def _run(losses, code=0):
    return verify.Run(code, losses, [100.0] * len(losses), Path("x.log"))


def test_losses_within_tolerance_match():
    comparison = verify.Comparison("1", _run([10.38326, 9.302387]), _run([10.38326, 9.302388]), rtol=1e-4)
    assert comparison.ok and comparison.problems == []


def test_a_loss_off_by_more_than_the_tolerance_is_named():
    comparison = verify.Comparison("dp2", _run([10.0, 9.0]), _run([10.0, 9.003]), rtol=1e-4)
    assert comparison.problems == ["iteration 2: lm loss 9.000000E+00 (original) vs 9.003000E+00 (ported)"]
    assert "MISMATCH within rtol 0.0001" in verify.table(comparison)


def test_missing_iterations_are_a_mismatch_and_a_failed_run_is_named_alone():
    comparison = verify.Comparison("tp2", _run([10.0, 9.0]), _run([10.0]), rtol=1e-4)
    assert comparison.problems == ["2 loss lines in the original, 1 in the ported run"]
    failed = _run([10.0, 9.0], code=1)
    failed.cause = "ModuleNotFoundError: No module named 'tensorboardX'"
    comparison = verify.Comparison("tp2", failed, _run([10.0]), rtol=1e-4)
    assert comparison.problems == ["original run failed: ModuleNotFoundError: No module named 'tensorboardX' (log: x.log)"]


def test_table_lists_every_iteration_and_the_speed_ratio():
    original, ported = _run([10.0, 9.5, 9.0]), _run([10.0, 9.5, 9.0])
    ported.ms_per_iter = [80.0, 50.0, 50.0]
    text = verify.table(verify.Comparison("1", original, ported, rtol=1e-4))
    assert "| 3 | 9.000000E+00 | 9.000000E+00 | 0.0e+00 |" in text
    assert "original 100.0, ported 50.0, ported is 2.00x the original's speed" in text
    assert text.endswith("MATCH within rtol 0.0001")


def _write(root: Path, files: dict[str, str | bytes]) -> Path:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return root


SOURCE = {
    "train.py": "import mpu\nloss = mpu.vocab_parallel_cross_entropy(logits, labels)\n",
    "mpu/__init__.py": "from .cross_entropy import vocab_parallel_cross_entropy\n",
    "mpu/cross_entropy.py": "def vocab_parallel_cross_entropy(logits, labels):\n    return logits\n",
    "mpu/tests/test_ce.py": "import mpu\nmpu.vocab_parallel_cross_entropy(1, 2)\n",
    "legacy.py": "print 'python 2'\n",
    "config/ds.json": b'{"train_batch_size": 4}\n',
}


def test_a_clean_migration_passes_the_static_checks(tmp_path):
    src = _write(tmp_path / "src", SOURCE)
    dst = tmp_path / "dst"
    assert cli_main([str(src), "-o", str(dst), "-q", "-j", "1"]) == 0  # legacy.py: no rule's word in it, not parsed
    assert verify.static_problems(src, dst) == []


def test_static_checks_name_each_problem(tmp_path):
    src = _write(tmp_path / "src", SOURCE)
    dst = _write(tmp_path / "dst", {
        **SOURCE,
        "train.py": "import mpu\nfrom apex.optimizers import FusedAdam\nloss = mpu.vocab_parallel_cross_entropy(x, y)\n",
        "model.py": "import apex.normalization\ndef broken(:\n",
        "config/ds.json": b'{"train_batch_size": 8}\n',
        "new.txt": "not from the original\n",
    })
    (tmp_path / "src" / "model.py").write_text("import apex.normalization\n")
    (tmp_path / "src" / "extra.txt").write_text("left behind\n")
    problems = verify.static_problems(src, dst)
    assert problems[:5] == [
        "config/ds.json: data file differs from the original",
        "model.py: does not compile: invalid syntax (line 2)",
        "new.txt: not in the original",
        "train.py:2: apex import left",
        "train.py:3: vocab_parallel_cross_entropy call left outside mpu/",
    ]
    assert problems[5] == "extra.txt: not in the migrated tree"
    assert problems[6].startswith("a second migration would make ")


def test_without_makes_packages_unimportable_for_the_script(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text("import sys\nprint(sys.argv[1:])\nimport json\n")
    run = subprocess.run([sys.executable, "-m", "harness.without", "json", str(script), "--flag", "1"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 1 and run.stdout == "['--flag', '1']\n"
    assert "ModuleNotFoundError: import of json halted" in run.stderr


def test_verify_refuses_a_directory_that_is_not_a_glm_checkout(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["--verify", str(tmp_path)])
    assert exc.value.code == 2
    assert f"{tmp_path} is not a THUDM/GLM checkout (no pretrain_glm.py)" in capsys.readouterr().err


def test_verify_help_explains_the_modes(capsys):
    with pytest.raises(SystemExit) as exc:
        cli_main(["--verify", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "--model-parallel-size 2" in out and "--rtol" in out and "exit status" in out
