"""glm-migrate fed what a user or a red team gives it (issue 15): each case, its message, its exit status.

The data-loss cases run on throwaway trees with a sibling file that must survive.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from migrate import runner
from migrate.cli import main
from migrate.report import FileReport, summarize, to_markdown
from migrate.rules import load_rules

TREE = Path(__file__).parent / "fixtures" / "tree"
REPO = Path(__file__).resolve().parents[2]


def _snapshot(root: Path) -> dict[str, bytes | str]:
    """Every file (bytes) and directory under ``root``, hidden ones included."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        out[rel] = path.read_bytes() if path.is_file() else "dir"
    return out


@pytest.fixture
def work(tmp_path) -> Path:
    """``work/GLM`` (a small GLM-shaped tree, every file migrates) and ``work/notes.txt`` beside it."""
    work = tmp_path / "work"
    shutil.copytree(TREE, work / "GLM")
    (work / "GLM" / "legacy_py2.py").unlink()
    (work / "notes.txt").write_text("a sibling file that must survive\n")
    return work


# -- 1. DST containing SRC, or inside it: refused whatever the flags ---------------------------------


def test_destination_that_contains_the_source_is_refused_whatever_the_flags(work, tmp_path, capsys):
    src = work / "GLM"
    (tmp_path / "alias").symlink_to(work)  # the same directory through a link
    before = _snapshot(tmp_path)
    for dst in (work, tmp_path / "alias", tmp_path, src, tmp_path / "alias" / "GLM"):
        for flags in ([], ["--force"], ["--force", "-j", "2"]):
            assert main([str(src), "-o", str(dst), "-q", *flags]) == 2, (dst, flags)
            err = capsys.readouterr().err
            assert err.count("\n") == 1 and "--force" not in err
            assert f"destination {dst} contains the source tree {src}" in err
    for dst in (src / "ported", tmp_path / "alias" / "GLM" / "mpu"):
        assert main([str(src), "-o", str(dst), "-q", "--force"]) == 2
        assert f"destination {dst} is inside the source tree" in capsys.readouterr().err
    assert _snapshot(tmp_path) == before


def test_force_replaces_only_what_glm_migrate_wrote(work, capsys):
    src, dst = work / "GLM", work / "GLM-ported"
    assert main([str(src), "-o", str(dst), "-q"]) == 0
    manifest = json.loads((dst / runner.MANIFEST).read_text())
    assert manifest["tool"] == "glm-migrate" and "pretrain_glm.py" in manifest["files"]

    assert main([str(src), "-o", str(dst), "-q"]) == 2  # its own output: --force is the way
    assert "holds an earlier glm-migrate output" in capsys.readouterr().err
    (src / "new_module.py").write_text("import torch\nx = torch.zeros(1).cuda()\n")
    (src / "config" / "config_block_tiny.json").unlink()
    assert main([str(src), "-o", str(dst), "-q", "--force"]) == 0
    assert "x = torch.zeros(1).to(torch.device())" in (dst / "new_module.py").read_text()
    assert not (dst / "config" / "config_block_tiny.json").exists()  # DST is replaced, not merged

    ported = _snapshot(dst)
    (dst / "my_notes.txt").write_text("mine")  # something the user added
    (dst / "mpu" / "grads.py").write_text("# fixed by hand\n")  # something the user edited
    (dst / "empty_dir").mkdir()
    assert main([str(src), "-o", str(dst), "-q", "--force"]) == 2
    err = capsys.readouterr().err
    assert "empty_dir/, mpu/grads.py, my_notes.txt (move it away" in err
    assert (dst / "my_notes.txt").read_text() == "mine" and (dst / "mpu" / "grads.py").read_text() == "# fixed by hand\n"
    (dst / "my_notes.txt").unlink(), (dst / "empty_dir").rmdir()
    (dst / "mpu" / "grads.py").write_bytes(ported["mpu/grads.py"])  # the same bytes, a new modification time
    assert main([str(src), "-o", str(dst), "-q", "--force"]) == 2
    assert "mpu/grads.py (move it away" in capsys.readouterr().err

    other = work / "other"  # a non-empty directory glm-migrate never wrote
    other.mkdir()
    (other / "data.bin").write_bytes(b"\x00data")
    (other / runner.MANIFEST).write_text('{"tool": "something else", "files": {}}')
    assert main([str(src), "-o", str(other), "-q", "--force"]) == 2
    err = capsys.readouterr().err
    assert "is not empty and glm-migrate did not write it" in err and "--force" not in err
    assert (other / "data.bin").read_bytes() == b"\x00data"
    assert (work / "notes.txt").exists()


# -- 2. -o . ----------------------------------------------------------------------------------------


def test_output_into_the_current_directory(work, monkeypatch):
    out = work / "out"
    out.mkdir()
    monkeypatch.chdir(out)
    assert main([str(work / "GLM"), "-o", ".", "-q"]) == 0
    first = _snapshot(out)
    assert main([str(work / "GLM"), "-o", ".", "-q", "--force"]) == 0
    assert sorted(os.listdir(work)) == ["GLM", "notes.txt", "out"]  # nothing like ..old.XXXX beside it
    again = _snapshot(Path("."))  # the shell's directory is still the output, not a removed one
    assert again.keys() == first.keys() and Path.cwd() == out.resolve()
    assert "pretrain_glm.py" in again and not [n for n in os.listdir(out) if "tmp" in n or "old" in n]


# -- 3. Ctrl-C ----------------------------------------------------------------------------------------


def _many_files(root: Path, n: int) -> None:
    for i in range(n):
        package = root / f"pkg{i % 10}"
        package.mkdir(parents=True, exist_ok=True)
        (package / f"mod{i}.py").write_text(
            "import torch\nfrom apex.optimizers import FusedAdam\n\n"
            + "".join(f"def f{j}(x):\n    return x.cuda() + torch.cuda.FloatTensor([{j}])\n\n" for j in range(4)))
        (package / f"data{i}.txt").write_text("x" * 100)


def _group(pgid: int) -> list[int]:
    """The processes whose process group is ``pgid``."""
    pids = []
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:  # after the name: state, ppid, pgrp
            pids.append(int(stat_file.parent.name))
    return pids


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads the process table from /proc")
def test_ctrl_c_stops_at_once_and_leaves_nothing(tmp_path):
    """SIGINT to the process group, twice 50 ms apart, while two workers migrate and while the
    output is written: one line, exit 130, no process left, DST absent, or as it was before a
    --force run. (During the interpreter's own start-up, before glm-migrate's code runs, Ctrl-C
    gets Python's traceback: not tested.)"""
    src, dst = tmp_path / "src", tmp_path / "dst"
    _many_files(src, 200)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    command = [sys.executable, "-m", "migrate.cli", str(src), "-o", str(dst), "-j", "2"]

    def interrupted(moment, *extra: str) -> subprocess.CompletedProcess:
        proc = subprocess.Popen([*command, *extra], env=env, start_new_session=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while proc.poll() is None and not moment(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.002)
        for _ in range(2):
            if _group(proc.pid):
                os.killpg(proc.pid, signal.SIGINT)
            time.sleep(0.05)
        try:
            out, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError("no exit 20 s after Ctrl-C") from None
        assert _group(proc.pid) == [], "processes left behind"
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def migrating(pid: int) -> bool:
        return len(_group(pid)) >= 3  # glm-migrate and its two workers

    def writing(pid: int) -> bool:
        return any(tmp_path.glob(".dst.glm-migrate-tmp.*")) or any(dst.glob(".glm-migrate-tmp.*"))

    stopped = 0
    for moment in (migrating, writing):
        result = interrupted(moment)
        assert sorted(p.name for p in tmp_path.iterdir()) in (["src"], ["dst", "src"])  # no staging left
        if result.returncode == 0:  # finished before the signal came: DST is whole
            assert (dst / runner.MANIFEST).exists()
            shutil.rmtree(dst)
            continue
        assert (result.returncode, result.stderr) == (130, "glm-migrate: interrupted\n"), moment
        assert not dst.exists()
        stopped += 1

    small = tmp_path / "small"  # DST as an earlier run left it (from a small tree: quicker)
    _many_files(small, 3)
    assert main([str(small), "-o", str(dst), "-q"]) == 0
    shutil.rmtree(small)
    before = _snapshot(dst)
    for moment in (migrating, writing):
        result = interrupted(moment, "--force")
        if result.returncode == 130:
            assert result.stderr == "glm-migrate: interrupted\n"
            assert _snapshot(dst) == before
            stopped += 1
        else:
            assert result.returncode == 0 and (dst / runner.MANIFEST).exists()
            before = _snapshot(dst)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["dst", "src"]
    assert stopped >= 3  # most interrupts come before the end, whatever the machine's load


# -- 4. files that are not Python 3, or not Python at all ---------------------------------------------


@pytest.fixture
def broken(tmp_path) -> Path:
    src = tmp_path / "src"
    src.mkdir()
    (src / "ok.py").write_text("import torch\nx = torch.zeros(1).cuda()\n")
    (src / "clean.py").write_text("import os\n")
    (src / "py2.py").write_text('import torch\nprint "loss", torch.zeros(1).cuda()\n')
    (src / "syntax.py").write_text("import torch\ndef f(:\n    return torch.zeros(1).cuda()\n")
    (src / "latin1.py").write_bytes(b"import torch\ns = '\xe9t\xe9'\nx = torch.zeros(1).cuda()\n")
    (src / "blob.py").write_bytes(b"\x7fELF\x02\x01\x00\x00torch cuda\x00\xff\xfe")
    return src


def test_files_that_do_not_parse_fail_the_run_and_the_check(broken, tmp_path, capsys):
    dst = tmp_path / "dst"
    assert main([str(broken), "-o", str(dst), "-q"]) == 1
    err = capsys.readouterr().err.splitlines()
    assert [line.split(": not migrated")[0] for line in err] == [
        f"glm-migrate: {broken / name}" for name in ("blob.py", "latin1.py", "py2.py", "syntax.py")]
    assert "not migrated (copied unchanged): not Python: binary data" in err[0]
    assert "cannot decode" in err[1] and "SyntaxError" in err[2] and "SyntaxError" in err[3]
    for name in ("py2.py", "syntax.py", "latin1.py", "blob.py"):  # copied as they are
        assert (dst / name).read_bytes() == (broken / name).read_bytes()
    summary = json.loads((dst / "migration_report.json").read_text())["summary"]
    assert (summary["files_scanned"], summary["errors"], summary["not_python"]) == (5, 4, 1)
    assert "blob.py" in (dst / "MIGRATION_REPORT.md").read_text()

    assert main([str(broken), "--check", "-q"]) == 1  # names what would change and what it could not check
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"{broken / 'ok.py'}: would change (2 changes)"
    assert [line.split(": not checked: ")[0] for line in out[1:]] == [
        str(broken / name) for name in ("blob.py", "latin1.py", "py2.py", "syntax.py")]

    assert main([str(dst), "--check", "-q"]) == 1  # migrated, but four files were never checked
    assert "would change" not in capsys.readouterr().out
    for name in ("py2.py", "syntax.py", "latin1.py", "blob.py"):
        (dst / name).unlink()
    assert main([str(dst), "--check", "-q"]) == 0
    assert main([str(dst), "--diff", "-q"]) == 0


# -- 5. one file in, one file out ---------------------------------------------------------------------


def test_single_file_in_file_out(tmp_path, capsys):
    one = tmp_path / "one.py"
    one.write_text("import torch\nx = torch.zeros(1).cuda()\n")
    one.chmod(0o750)
    assert main([str(one), "-o", str(tmp_path / "one_shim.py"), "-q"]) == 0
    assert (tmp_path / "one_shim.py").read_text() == "import shim as torch\nx = torch.zeros(1).to(torch.device())\n"
    assert (tmp_path / "one_shim.py").stat().st_mode & 0o777 == 0o750
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.py", "one_shim.py"]  # reports only on request

    nested = tmp_path / "x" / "one_shim.py"
    assert main([str(one), "-o", str(nested), "--report", str(tmp_path / "r" / "one.json"), "-q"]) == 0
    assert nested.is_file() and nested.read_bytes() == (tmp_path / "one_shim.py").read_bytes()
    assert json.loads((tmp_path / "r" / "one.json").read_text())["files"][0]["path"] == "one.py"
    assert (tmp_path / "r" / "one.md").exists()

    assert main([str(one), "-o", str(nested), "-q"]) == 2
    assert "destination exists" in capsys.readouterr().err
    nested.write_text("old")
    assert main([str(one), "-o", str(nested), "-q", "--force"]) == 0
    assert nested.read_text().startswith("import shim as torch")
    assert main([str(one), "-o", str(one), "-q", "--force"]) == 2
    assert "use --in-place" in capsys.readouterr().err
    assert one.read_text() == "import torch\nx = torch.zeros(1).cuda()\n"

    assert main([str(one), "-o", str(tmp_path / "tree"), "-q"]) == 0  # no .py suffix: a directory, as before
    assert (tmp_path / "tree" / "one.py").is_file() and (tmp_path / "tree" / "migration_report.json").is_file()


# -- 6. the Markdown report prints notes whole -------------------------------------------------------


def test_markdown_report_prints_every_note_and_reason_whole():
    rules = {rule.code: rule for rule in load_rules()}
    reason = "a long reason " * 20 + "that ends here."
    files = [FileReport("a.py", changes=[{"line": 1, "code": code, "before": "x", "after": "y", "target": "t"}
                                         for code in rules],
                        unconverted=[{"line": 2, "code": "APX101", "reason": reason}])]
    text = to_markdown(summarize(files, files_changed=1, seconds=0.1), files, rules)
    for rule in rules.values():
        assert " ".join(rule.note.split()).replace("|", "\\|") in text, rule.code
    assert "An explicit device index is replaced by the active device." in text  # CUD004, marked review
    assert reason.strip() in text


# -- 7. --verify when a run fails: one line with the cause, no progress bars in a log ------------------

FAILING_PRETRAIN = """\
import sys
print("using world size: 1 and model-parallel size: 1")
import glm_migrate_test_absent_module  # as upstream's `from tensorboardX import SummaryWriter` fails without it
"""


@pytest.mark.parametrize("mode", ["1", "dp2"])
def test_a_failed_run_is_named_by_the_exception_it_ended_on(mode, tmp_path):
    from harness import verify

    tree = tmp_path / "GLM"
    tree.mkdir()
    (tree / "pretrain_glm.py").write_text(FAILING_PRETRAIN)
    run = verify.pretrain(tree, verify.ported_env(), mode, 2, 300, ["pretrain_glm.py"])
    assert run.code != 0 and run.losses == []
    assert run.cause == ("ModuleNotFoundError: No module named 'glm_migrate_test_absent_module'; "
                         "upstream's dependencies: pip install -e \".[upstream]\" (docs/upstream.md)"), \
        run.log.read_text()[-4000:]  # the rank's error, not torchrun's own


def test_verify_says_in_one_line_why_a_run_failed(tmp_path, monkeypatch, capsys):
    from harness import verify

    original, ported = tmp_path / "GLM", tmp_path / "GLM-ported"
    for tree in (original, ported):
        tree.mkdir()
        (tree / "pretrain_glm.py").write_text(FAILING_PRETRAIN)
    monkeypatch.setattr(verify, "prepare", lambda upstream, workdir, vocab: (original, ported))
    monkeypatch.setattr(verify, "static_problems", lambda src, dst: [])
    assert verify.main([str(original), "--modes", "1", "--iters", "2", "--no-mpu-tests", "--workdir", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    out = captured.out.splitlines()
    failed = [line for line in out if "run failed" in line]
    assert [line.split(" (log: ")[0] for line in failed] == [
        f"{side} run failed: ModuleNotFoundError: No module named 'glm_migrate_test_absent_module'; "
        "upstream's dependencies: pip install -e \".[upstream]\" (docs/upstream.md)" for side in ("original", "ported")]
    assert not any(word in captured.out for word in ("MISMATCH", "nan", "speed", "| iteration |"))
    assert out[-1].startswith("0 of 1 modes match; failing: 1; logs in")
    assert captured.err == ""  # stderr is no terminal here: no progress bar to end up in a log


def test_a_file_put_into_dst_while_it_runs_is_not_deleted(work, monkeypatch, capsys):
    src, dst = work / "GLM", work / "out"
    dst.mkdir()  # empty when checked
    fill = runner._fill

    def fill_then_user_writes(staging, *args):
        fill(staging, *args)
        (dst / "arrived_meanwhile.txt").write_text("mine")

    monkeypatch.setattr(runner, "_fill", fill_then_user_writes)
    assert main([str(src), "-o", str(dst), "-q"]) == 2
    assert "changed while glm-migrate ran: arrived_meanwhile.txt" in capsys.readouterr().err
    assert os.listdir(dst) == ["arrived_meanwhile.txt"]


def test_failure_cause_reads_interleaved_rank_tracebacks():
    from harness import verify

    log = "\n".join([
        "[rank0]: Traceback (most recent call last):",
        "[rank1]: Traceback (most recent call last):",
        '[rank0]:   File "pretrain_glm.py", line 3, in <module>',
        "using world size: 2 and model-parallel size: 1",
        '[rank1]:   File "pretrain_glm.py", line 3, in <module>',
        "[rank0]:     import utils",
        "[rank0]: ModuleNotFoundError: No module named 'tensorboardX'",
        "[rank1]: ModuleNotFoundError: No module named 'tensorboardX'",
        "Traceback (most recent call last):",
        '  File "torch/distributed/run.py", line 9, in main',
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: pretrain_glm.py FAILED",
    ])
    assert verify.failure_cause(1, log).startswith("ModuleNotFoundError: No module named 'tensorboardX'; ")
    assert verify.failure_cause(1, "Traceback (most recent call last):\n  File \"x\"\nKeyboardInterrupt\n") == \
        "KeyboardInterrupt"
    assert verify.failure_cause(-1, "iteration 1\n[timed out after 900 s]") == "timed out after 900 s"
    assert verify.failure_cause(-9, "") == "killed by SIGKILL"
    assert verify.failure_cause(3, "loading\nno data found\n") == "exit status 3; last line: no data found"
