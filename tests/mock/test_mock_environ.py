"""enable / disable: PYTHONPATH gets the hook first, and comes back exactly as it was."""

import shlex
import shutil
import subprocess
import sys

import pytest

from migrate.mock import environ as mock_env
from migrate.mock.environ import ENV_ACTIVE, ENV_SAVED, SITE_DIR

UNSET = None
GLM_MOCK = f"{shlex.quote(sys.executable)} -m migrate.mock.cli"


@pytest.mark.parametrize("before", [UNSET, "", "/a:/b"])
def test_enable_then_disable_restores_pythonpath_exactly(before):
    env = {} if before is UNSET else {"PYTHONPATH": before}
    on = mock_env.apply(env, mock_env.enable_changes(env))
    assert on["PYTHONPATH"].split(":")[0] == SITE_DIR
    assert on["PYTHONPATH"] == (SITE_DIR + ":/a:/b" if before else SITE_DIR)
    off = mock_env.apply(on, mock_env.disable_changes(on))
    assert off == env


def test_enable_twice_does_not_stack():
    env = {"PYTHONPATH": "/a"}
    once = mock_env.apply(env, mock_env.enable_changes(env))
    twice = mock_env.apply(once, mock_env.enable_changes(once, "apex"))
    assert twice["PYTHONPATH"] == SITE_DIR + ":/a" and twice[ENV_SAVED] == "/a"
    assert twice["GLM_MOCK_FORCE"] == "apex"
    assert mock_env.apply(twice, mock_env.disable_changes(twice)) == env


def test_disable_keeps_edits_made_while_enabled():
    on = mock_env.apply({"PYTHONPATH": "/a"}, mock_env.enable_changes({"PYTHONPATH": "/a"}))
    on["PYTHONPATH"] = "/mine:" + on["PYTHONPATH"]
    off = mock_env.apply(on, mock_env.disable_changes(on))
    assert off == {"PYTHONPATH": "/mine:/a"}


def test_disable_when_not_enabled_changes_nothing():
    assert mock_env.disable_changes({"PYTHONPATH": "/a"}) == {}


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not found")
@pytest.mark.parametrize("setup", ["unset PYTHONPATH", "export PYTHONPATH=", "export PYTHONPATH='/x y:/z'"])
def test_eval_in_a_real_shell_round_trips_the_environment(setup):
    script = f"""
        {setup}; unset {ENV_ACTIVE} {ENV_SAVED} GLM_MOCK_FORCE
        before="$(env | sort)"
        eval "$({GLM_MOCK})"
        case "$PYTHONPATH" in {SITE_DIR}*) ;; *) echo "not first: $PYTHONPATH"; exit 3;; esac
        {shlex.quote(sys.executable)} -c 'import sys; assert any(type(f).__name__ == "MockFinder" for f in sys.meta_path)' || exit 4
        eval "$({GLM_MOCK} disable)"
        after="$(env | sort)"
        [ "$before" = "$after" ] || {{ diff <(echo "$before") <(echo "$after"); exit 5; }}
        [ "${{PYTHONPATH+set}}" = "$(printf %s "{'' if setup.startswith('unset') else 'set'}")" ] || exit 6
    """
    proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_fish_syntax():
    code = mock_env.shell_code({"PYTHONPATH": "/a b", "GLM_MOCK_FORCE": None}, "fish")
    assert code == "set -gx PYTHONPATH '/a b';\nset -e GLM_MOCK_FORCE;"
