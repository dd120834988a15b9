"""The start-up hook in fresh interpreters: the user's sitecustomize and PYTHONPATH survive, the kill
switch works, and an installed apex wins unless forced."""

import sys

import pytest

from .conftest import clean_env, mocked_env, run

PROBE = (
    "import sys, apex; "
    "print(type(apex).__name__, getattr(sys.modules['sitecustomize'], 'USER_SITE', None), "
    "[p for p in sys.path if p.endswith('user')])"
)


@pytest.fixture
def user_dir(tmp_path):
    user = tmp_path / "user"
    user.mkdir()
    (user / "sitecustomize.py").write_text("USER_SITE = 'ran'\n")
    return user


def test_user_sitecustomize_and_pythonpath_are_kept(user_dir):
    proc = run([sys.executable, "-c", PROBE], mocked_env(PYTHONPATH=str(user_dir)))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split(None, 2) == ["StandIn", "ran", f"['{user_dir}']\n"]


def test_kill_switch_turns_the_mock_off_but_not_the_user_hook(user_dir):
    env = mocked_env(PYTHONPATH=str(user_dir), GLM_MOCK_DISABLE="1")
    proc = run([sys.executable, "-c", "import sitecustomize; print(sitecustomize.USER_SITE); import apex"], env)
    assert proc.stdout == "ran\n"
    assert "ModuleNotFoundError: No module named 'apex'" in proc.stderr


def test_installed_apex_wins_unless_forced(tmp_path):
    (tmp_path / "apex").mkdir()
    (tmp_path / "apex" / "__init__.py").write_text("REAL = True\n")
    code = "import apex; print(type(apex).__name__, getattr(apex, 'REAL', None))"
    real = run([sys.executable, "-c", code], mocked_env(PYTHONPATH=str(tmp_path)))
    assert real.stdout == "module True\n", real.stderr
    forced = run([sys.executable, "-c", code], mocked_env(force="apex", PYTHONPATH=str(tmp_path)))
    assert forced.stdout == "StandIn None\n", forced.stderr


def test_without_the_mock_nothing_is_redirected():
    proc = run([sys.executable, "-c", "import apex"], clean_env())
    assert "No module named 'apex'" in proc.stderr


def test_torch_gets_compat_on_import_and_keeps_its_own_loader():
    code = (
        "import torch, shim.compat; "
        "print(type(torch.__loader__).__name__, type(torch.__spec__.loader).__name__, shim.compat.is_installed())"
    )
    assert run([sys.executable, "-c", code], mocked_env()).stdout == "SourceFileLoader SourceFileLoader True\n"
    assert run([sys.executable, "-c", code], clean_env()).stdout == "SourceFileLoader SourceFileLoader False\n"


def test_the_rule_tables_are_read_only_when_an_import_could_be_mocked(tmp_path):
    """A process importing only the standard library never reads rules/ (start-up stays cheap); the
    first other import reads the scopes, and a mocked name still resolves after that."""
    (tmp_path / "mine.py").write_text("X = 1\n")
    code = ("import sys, json, csv; print('tomllib' in sys.modules, 'migrate.rules' in sys.modules); "
            "import mine; print('tomllib' in sys.modules, 'migrate.rules' in sys.modules); "
            "import apex.optimizers; print('migrate.rules' in sys.modules)")  # fmt: skip
    proc = run([sys.executable, "-c", code], mocked_env(PYTHONPATH=str(tmp_path)))
    assert proc.stdout.splitlines() == ["False False", "True False", "True"], proc.stderr
