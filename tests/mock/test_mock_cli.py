"""The glm-mock command: shell code, run, and the --list dry run."""

import sys

import pytest

from migrate.mock import cli
from migrate.mock.environ import SITE_DIR
from migrate.mock.finder import find_installed

from .conftest import clean_env, run


def test_default_command_is_enable(capsys, monkeypatch):
    monkeypatch.delenv("PYTHONPATH", raising=False)
    monkeypatch.delenv("GLM_MOCK_ACTIVE", raising=False)
    assert cli.main([]) == 0
    assert f"export PYTHONPATH={SITE_DIR};" in capsys.readouterr().out.splitlines()


def test_list_shows_backing_per_name_and_respects_installed_and_force(capsys):
    installed = find_installed("deepspeed") is not None
    assert cli.main(["--list"]) == 0
    out = capsys.readouterr().out
    if installed:
        assert "deepspeed   real package wins:" in out
        assert "  (real package used)" in next(line for line in out.splitlines() if "deepspeed.init_distributed" in line)
    else:
        assert "deepspeed   stand-in (DeepSpeed (pip install deepspeed) not installed)" in out
    row = next(line for line in out.splitlines() if " apex.optimizers.FusedAdam " in line)
    assert row.split()[:3] == ["APX001", "apex.optimizers.FusedAdam", "shim.optim.FusedAdam"]
    assert "not covered: apex.amp has no shim equivalent" in out
    assert cli.main(["list", "--force", "deepspeed"]) == 0
    forced = capsys.readouterr().out
    assert ("deepspeed   stand-in, forced over the installed" if installed else "deepspeed   stand-in (") in forced
    assert "(real package used)" not in forced


def test_bad_force_is_one_line_error(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["enable", "--force", "apx"])
    assert exc.value.code == 2
    assert "--force: unknown package(s) ['apx']" in capsys.readouterr().err


def test_run_passes_the_mock_and_the_exit_code_through():
    code = "import sys, apex; sys.exit(7 if type(apex).__name__ == 'StandIn' else 1)"
    proc = run([sys.executable, "-m", "migrate.mock.cli", "run", "--", sys.executable, "-c", code], clean_env())
    assert proc.returncode == 7, proc.stderr


def test_run_without_command_explains(capsys):
    with pytest.raises(SystemExit):
        cli.main(["run"])
    assert "run: give a command" in capsys.readouterr().err


def test_list_flag_after_run_belongs_to_the_command():
    assert cli._normalise(["run", "--", "tool", "--list"]) == ["run", "--", "tool", "--list"]
    assert cli._normalise(["--force", "apex", "--list"]) == ["list", "--force", "apex"]


@pytest.mark.parametrize("argv", [["--list"], ["disable"]])
def test_a_reader_that_went_away_ends_it_quietly(argv):
    """`glm-mock --list | head`: the pipe's reader closes early. Here it is closed before glm-mock writes a
    byte, so every write fails: no BrokenPipeError traceback, exit 1, nothing on stderr."""
    import os
    import subprocess

    from .conftest import REPO

    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([sys.executable, "-m", "migrate.mock.cli", *argv], stdout=write, stderr=subprocess.PIPE,
                              env=clean_env(PYTHONPATH=str(REPO)), text=True, timeout=120)
    finally:
        os.close(write)
    assert done.stderr == "" and done.returncode == 1, done.stderr
