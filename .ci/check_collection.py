"""CI: every ``tests/**/test_*.py`` must be collected by the README's plain ``pytest``.

pytest silently skips folders its ``norecursedirs`` names (``dist``, ``build``, ``venv``, dot-folders...);
``tests/dist`` once went unrun that way. This collects the suite as ``pytest`` would (no arguments: the
``testpaths`` of pyproject.toml), prints how many tests and files it found, and exits 1 naming every test
file it did not reach. A module skipped as a whole (e.g. it needs GLM_UPSTREAM) still counts as reached.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest



class _Reached:
    def __init__(self, root: Path):
        self.root = root
        self.files: set[Path] = set()
        self.tests = 0

    def pytest_collectreport(self, report):
        path = report.nodeid.split("::", 1)[0]
        if path.endswith(".py"):
            self.files.add((self.root / path).resolve())

    def pytest_collection_finish(self, session):
        self.tests = len(session.items)


def main(root: Path) -> int:
    """``root``: the project (its pyproject.toml / pytest config and ``tests/``); pytest runs from there."""
    root = root.resolve()
    os.chdir(root)
    reached = _Reached(root)
    code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "--rootdir", str(root)], plugins=[reached])
    if code not in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        print(f"check_collection: collection failed (pytest exit {int(code)})", file=sys.stderr)
        return 1
    expected = {p.resolve() for p in (root / "tests").rglob("test_*.py")}
    missing = sorted(str(p.relative_to(root)) for p in expected - reached.files)
    print(f"check_collection: {reached.tests} tests in {len(expected & reached.files)} of {len(expected)} test files")
    if missing:
        print("check_collection: pytest does not collect: " + ", ".join(missing), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":  # check_collection.py [PROJECT_ROOT]  (default: this checkout)
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent.parent))
