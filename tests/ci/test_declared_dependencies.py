"""What the package imports is declared in pyproject.toml, so ``pip install -e ".[dev]"`` on a fresh machine
runs what CI runs (onnxruntime was imported but undeclared: CI passed only where it was installed by hand)."""

import ast
import importlib.metadata
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("migrate", "shim", "glm_port", "harness")  # what pyproject installs


def declared() -> dict[str, set[str]]:
    """Each extra's distribution names ('' for the core dependencies), canonicalized."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups = {"": project["dependencies"], **project["optional-dependencies"]}
    return {group: {canonicalize_name(Requirement(spec).name) for spec in specs} for group, specs in groups.items()}


def imported_modules() -> dict[str, str]:
    """Top-level third-party modules the installed packages import (absolute imports), each with one file."""
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                else:
                    continue
                for name in names:
                    top = name.split(".")[0]
                    if top not in sys.stdlib_module_names and top not in PACKAGES:
                        found.setdefault(top, str(path.relative_to(ROOT)))
    return found


def test_every_imported_module_is_a_declared_distribution():
    everything = set().union(*declared().values())
    distributions = importlib.metadata.packages_distributions()
    assert "onnxruntime" in imported_modules()  # the scan sees the imports inside functions too
    undeclared = []
    for module, where in imported_modules().items():
        names = distributions.get(module) or [module]  # not installed here: the module's own name
        if not any(canonicalize_name(name) in everything for name in names):
            undeclared.append(f"{module} (imported in {where})")
    assert not undeclared, f"imported but not in pyproject.toml: {undeclared}"


def test_onnx_export_needs_are_the_onnx_extra_and_dev_installs_them():
    from glm_port.convert.decode_step import ONNX_INSTALL, ONNX_MODULES

    groups = declared()
    needed = {canonicalize_name(module) for module in ONNX_MODULES}
    assert needed == {"onnx", "onnxruntime"}
    assert needed <= groups["onnx"] and needed <= groups["dev"]  # the ONNX tests run after pip install -e ".[dev]"
    assert "[onnx]" in ONNX_INSTALL  # what glm-export --onnx tells a user who lacks them
