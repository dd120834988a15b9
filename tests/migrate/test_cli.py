"""glm-migrate end to end on a small tree in upstream's shape: output, report, modes, exit codes."""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from migrate import runner
from migrate.cli import main

TREE = Path(__file__).parent / "fixtures" / "tree"
EXPECTED = Path(__file__).parent / "fixtures" / "tree_expected"


PY2 = "legacy_py2.py"  # in the fixture tree: a file that does not parse


def _files(root: Path) -> dict[str, bytes]:
    files = {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}
    files.pop(runner.MANIFEST, None)
    return files


def _expected() -> dict[str, bytes]:
    expected = _files(EXPECTED)
    del expected[PY2]
    return expected


@pytest.fixture
def src(tmp_path) -> Path:
    """The fixture tree without its Python 2 file: every file migrates, runs exit 0."""
    copy = tmp_path / "GLM"
    shutil.copytree(TREE, copy)
    (copy / PY2).unlink()
    return copy


def test_tree_migrates_to_the_expected_tree(tmp_path, capsys):
    src, dst = tmp_path / "GLM", tmp_path / "out"
    shutil.copytree(TREE, src)
    assert main([str(src), "-o", str(dst), "-q", "-j", "1"]) == 1  # legacy_py2.py does not parse
    assert capsys.readouterr().err == (f"glm-migrate: {src / PY2}: not migrated (copied unchanged): SyntaxError: "
                                       "Missing parentheses in call to 'print'. Did you mean print(...)? (line 4)\n")
    produced = _files(dst)
    report = json.loads(produced.pop("migration_report.json"))
    assert produced.pop("MIGRATION_REPORT.md").startswith(b"# Migration report")
    assert produced == _files(EXPECTED)
    assert os.access(dst / "scripts" / "ds_pretrain_tiny.sh", os.X_OK)  # modes are kept

    summary = report["summary"]
    assert summary["files_scanned"] == 20
    assert summary["files_changed"] == 15
    assert summary["errors"] == 1 and summary["not_python"] == 0
    assert summary["unconverted"] == 0 and summary["conversion_rate"] == 1.0
    assert summary["changes"] == sum(summary["changes_by_rule"].values())
    assert summary["changes_by_rule"]["MPU001"] == 1
    assert set(summary) >= {"files_scanned", "files_changed", "changes_by_rule", "unconverted",
                            "conversion_rate", "errors", "seconds"}
    by_path = {f["path"]: f for f in report["files"]}
    assert len(by_path) == 20 and by_path["data_utils/__init__.py"]["changes"] == []
    assert set(by_path["pretrain_glm.py"]) == {"path", "changes", "unconverted", "kept", "error"}
    assert by_path["legacy_py2.py"]["error"].startswith("SyntaxError")
    assert [(k["line"], k["code"]) for k in by_path["train_utils.py"]["kept"]] == [(34, "DSP101")]
    change = next(c for c in by_path["pretrain_glm.py"]["changes"] if c["code"] == "MPU001")
    assert change["line"] == 30
    assert change["before"].startswith("mpu.vocab_parallel_cross_entropy(logits.contiguous().float(),")
    assert "process_group=mpu.get_model_parallel_group()" in change["after"]


def test_destination_keeps_the_source_trees_mode(src, tmp_path):
    src.chmod(0o750)
    assert main([str(src), "-o", str(tmp_path / "out"), "-q", "-j", "1"]) == 0
    assert (tmp_path / "out").stat().st_mode & 0o777 == 0o750


def test_bytecode_caches_are_left_behind(src, tmp_path):
    (src / "mpu" / "__pycache__").mkdir()
    (src / "mpu" / "__pycache__" / "grads.cpython-311.pyc").write_bytes(b"stale")
    assert main([str(src), "-o", str(tmp_path / "out"), "-q"]) == 0
    assert not (tmp_path / "out" / "mpu" / "__pycache__").exists()


def test_parallel_run_matches_serial(src, tmp_path):
    assert main([str(src), "-o", str(tmp_path / "one"), "-q", "-j", "1"]) == 0
    assert main([str(src), "-o", str(tmp_path / "two"), "-q", "-j", "2"]) == 0
    one, two = _files(tmp_path / "one"), _files(tmp_path / "two")
    for name in ("migration_report.json", "MIGRATION_REPORT.md"):  # these hold timings
        one.pop(name), two.pop(name)
    assert one == two


def test_output_is_idempotent(src, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    assert main([str(src), "-o", str(first), "-q"]) == 0
    assert main([str(first), "--check", "-q"]) == 0
    assert main([str(first), "-o", str(second), "-q"]) == 0
    # the reports hold timings, the manifests modification times
    assert filecmp.dircmp(first, second).diff_files == [runner.MANIFEST, "MIGRATION_REPORT.md", "migration_report.json"]


def test_check_and_diff_write_nothing(src, tmp_path, capsys):
    before = _files(src)
    assert main([str(src), "--check", "-q"]) == 1
    assert main([str(src), "--diff", "-q"]) == 0
    out = capsys.readouterr().out
    assert "--- a/mpu/grads.py\n+++ b/mpu/grads.py\n" in out
    assert "\n-from torch._six import inf\n" in out and "\n+from shim.compat.six import inf\n" in out
    assert _files(src) == before
    assert main([str(src), "--diff", "-o", str(tmp_path / "out"), "-q"]) == 0
    assert not (tmp_path / "out").exists()


def test_check_can_still_write_a_report(src, tmp_path):
    report = tmp_path / "ci" / "report.json"
    assert main([str(src), "--check", "--report", str(report), "-q"]) == 1
    assert json.loads(report.read_text())["summary"]["files_changed"] == 15
    assert report.with_suffix(".md").exists()


def test_in_place(src):
    assert main([str(src), "--in-place", "-q"]) == 0
    migrated = _files(src)
    migrated.pop("migration_report.json"), migrated.pop("MIGRATION_REPORT.md")
    assert migrated == _expected()
    assert main([str(src), "--check", "-q"]) == 0


def test_select_and_ignore(src, tmp_path):
    assert main([str(src), "-o", str(tmp_path / "apex"), "--select", "APX", "-q"]) == 0
    train_utils = (tmp_path / "apex" / "train_utils.py").read_text()
    assert "from shim.optim import FusedAdam as Adam" in train_utils
    assert "import torch\n" in train_utils and "from torch import distributed as dist" in train_utils
    assert main([str(src), "-o", str(tmp_path / "no-cuda"), "--ignore", "CUD004,NPY", "-q"]) == 0
    assert ".cuda()" in (tmp_path / "no-cuda" / "pretrain_glm.py").read_text()
    assert "np.long" in (tmp_path / "no-cuda" / "blocklm_utils.py").read_text()


@pytest.mark.parametrize("argv, message", [
    (["missing-dir", "-o", "out"], "source not found"),
    (["{src}", "-o", "{src}/ported"], "is inside the source tree"),
    (["{src}", "--select", "XYZ", "--check"], "unknown rule code or family: XYZ"),
])
def test_usage_errors_exit_2(argv, message, src, capsys, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    assert main([a.format(src=src) for a in argv]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_destination_not_empty_is_refused_even_with_force(src, tmp_path, capsys):
    dst = tmp_path / "out"
    dst.mkdir()
    (dst / "keep.txt").write_text("x")
    for force in ([], ["--force"]):
        assert main([str(src), "-o", str(dst), "-q", *force]) == 2
        err = capsys.readouterr().err
        assert "destination is not empty and glm-migrate did not write it" in err and "--force" not in err
    assert _files(dst) == {"keep.txt": b"x"}


def test_missing_destination_is_a_usage_error(src, capsys):
    with pytest.raises(SystemExit) as exc:
        main([str(src)])
    assert exc.value.code == 2
    assert "-o DST or --in-place" in capsys.readouterr().err


def test_failed_write_leaves_no_destination(src, tmp_path, monkeypatch):
    """DST is complete or absent: a failure while copying leaves neither DST nor a staging directory."""
    def broken_copy(*args, **kwargs):
        raise OSError(28, "No space left on device", "config/config_block_tiny.json")

    monkeypatch.setattr(runner.shutil, "copy2", broken_copy)
    assert main([str(src), "-o", str(tmp_path / "out"), "-q"]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["GLM"]


def test_single_file(src, capsys):
    assert main([str(src / "mpu" / "grads.py"), "--diff", "-q"]) == 0
    assert "+from shim.compat.six import inf" in capsys.readouterr().out


def test_console_script_help():
    out = subprocess.run([sys.executable, "-m", "migrate.cli", "--help"], capture_output=True, text=True, check=True)
    for flag in ("--diff", "--check", "-j N", "--select CODES", "--ignore CODES", "--report PATH", "--quiet",
                 "--in-place", "exit status"):
        assert flag in out.stdout


def test_own_rule_tables(src, tmp_path, capsys):
    tables = tmp_path / "rules"
    tables.mkdir()
    (tables / "local.toml").write_text('[[rule]]\ncode = "LOC001"\nkind = "module"\n'
                                       'match = "deepspeed.checkpointing"\ntarget = "shim.checkpointing"\n')
    assert main([str(src / "mpu" / "transformer.py"), "--diff", "-q", "--rules", str(tables)]) == 0
    out = capsys.readouterr().out
    assert "+        if shim.checkpointing.is_configured():" in out and "+import shim\n" in out
    assert "-import torch\n" not in out  # only the local table applies
    assert main([str(src), "--check", "--rules", str(tmp_path / "missing")]) == 2
    assert "rule tables not found" in capsys.readouterr().err



@pytest.mark.parametrize("tables", [{}, {"notes.txt": "not a table"},
                                    {"scopes.toml": '[[mock_scope]]\nname = "apex"\ninstall = "NVIDIA apex"\n'}])
def test_an_empty_rule_set_is_an_error(src, tmp_path, capsys, tables):
    """Not '0 changes (100.0%)' and exit 0: rules that convert nothing are a mistake in --rules."""
    (tmp_path / "rules").mkdir()
    for name, text in tables.items():
        (tmp_path / "rules" / name).write_text(text)
    assert main([str(src), "-o", str(tmp_path / "out"), "--rules", str(tmp_path / "rules")]) == 2
    out, err = capsys.readouterr()
    assert err.startswith(f"glm-migrate: error: no rules in {tmp_path / 'rules'}: ") and len(err.splitlines()) == 1, err
    assert "*.toml" in err and "100.0%" not in out and not (tmp_path / "out").exists()


def test_report_opens_with_the_coverage_table(tmp_path):
    """Per package: found = converted + kept + unconverted, and what to do by hand for the unconverted."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text(
        "import amp_C\n"
        "import torch\n"
        "from apex import amp\n"
        "from apex.multi_tensor_apply import multi_tensor_applier\n"
        "from torch.utils import cpp_extension\n"
        "\n"
        "\n"
        "def step(grads, noop):\n"
        "    multi_tensor_applier(amp_C.multi_tensor_scale, noop, [grads, grads], 0.5)\n"
        "    torch.distributed.barrier()\n"
        "    return amp, torch.cuda.current_device()\n",
        encoding="utf-8",
    )
    assert main([str(src), "-o", str(tmp_path / "dst"), "--quiet"]) == 0
    coverage = json.loads((tmp_path / "dst" / "migration_report.json").read_text())["summary"]["coverage"]
    assert list(coverage)[:6] == ["apex", "amp_C", "deepspeed", "torch.cuda", "torch.distributed", "megatron fused kernels"]
    assert coverage["apex"] == {"found": 3, "converted": 1, "kept": 0, "unconverted": 2, "by_hand": {"APX101": 2}}
    assert coverage["amp_C"]["converted"] == 1 and coverage["amp_C"]["unconverted"] == 0
    assert coverage["torch.utils.cpp_extension"]["kept"] == 1
    for row in coverage.values():
        assert row["found"] == row["converted"] + row["kept"] + row["unconverted"]
    markdown = (tmp_path / "dst" / "MIGRATION_REPORT.md").read_text()
    assert markdown.index("## Coverage by package") < markdown.index("| rule | changes |")
    assert "| apex | 3 | 1 | 0 | 2 | APX101 x2: apex.amp has no shim equivalent: use torch.autocast" in markdown
