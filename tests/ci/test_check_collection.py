""".ci/check_collection.py: CI fails when pytest's default ``norecursedirs`` hides a test folder (``dist``)."""

import subprocess
import sys
from pathlib import Path

CHECK = Path(__file__).resolve().parents[2] / ".ci" / "check_collection.py"


def _project(root: Path, folder: str) -> Path:
    (root / "pyproject.toml").write_text('[tool.pytest.ini_options]\ntestpaths = ["tests"]\n')
    for name, body in ((f"tests/{folder}/test_ranks.py", "def test_a():\n    pass\n"),
                       ("tests/unit/test_math.py", "def test_b():\n    pass\n\ndef test_c():\n    pass\n"),
                       ("tests/unit/test_skipped.py", "import pytest\npytest.skip('needs X', allow_module_level=True)\n")):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(body)
    return root


def _check(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(CHECK), str(root)], capture_output=True, text=True, timeout=120)


def test_a_folder_named_dist_is_reported(tmp_path):
    done = _check(_project(tmp_path, "dist"))
    assert done.returncode == 1
    assert "check_collection: 2 tests in 2 of 3 test files" in done.stdout
    assert "pytest does not collect: tests/dist/test_ranks.py" in done.stderr


def test_every_file_reached_passes_and_prints_the_count(tmp_path):
    done = _check(_project(tmp_path, "distributed"))
    assert done.returncode == 0, done.stderr
    assert "check_collection: 3 tests in 3 of 3 test files" in done.stdout  # a module skipped whole counts
