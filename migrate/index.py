"""The repo-wide view: which module of the migrated tree is which.

Names are resolved the way Python would resolve them when the tree's root is
on ``sys.path`` (how GLM-era scripts run): ``import mpu`` is the tree's
``mpu`` package, ``from .initialize import x`` is relative to the importing
file's package, and a script's own directory comes next (``from commons
import ...`` in ``mpu/tests/``). Anything else is external (torch, apex...).

Package re-exports are followed through each tree module's top-level imports,
so ``mpu.vocab_parallel_cross_entropy`` is known to be
``mpu.cross_entropy.vocab_parallel_cross_entropy``. Export tables come from
the stdlib ``ast`` (a C parser), read once per module and only when asked.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path


def module_name(relpath: Path) -> str:
    """``mpu/cross_entropy.py`` -> ``mpu.cross_entropy``; ``mpu/__init__.py`` -> ``mpu``."""
    parts = list(relpath.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@dataclass
class Exports:
    """A tree module's top-level names: imported ones (name -> fully-qualified source) and the rest."""

    imported: dict[str, str] = field(default_factory=dict)
    defined: set[str] = field(default_factory=set)
    star_sources: list[str] = field(default_factory=list)


class ModuleIndex:
    """Modules of one source tree, keyed by dotted name."""

    def __init__(self, root: Path, python_files: list[Path], reexport_words: frozenset[str] | None = None):
        """``reexport_words``: when given, only modules whose text mentions one of these names are
        read for re-exports (the others cannot lead to a rule), which saves parsing most of the tree."""
        self.root = root
        self.reexport_words = [w.encode() for w in reexport_words] if reexport_words is not None else None
        self.files: dict[str, Path] = {}
        self.packages: set[str] = set()
        for rel in python_files:
            name = module_name(rel)
            if not name:  # a top-level __init__.py: the root itself is not importable by name
                continue
            self.files[name] = rel
            if rel.name == "__init__.py":
                self.packages.add(name)
            # directories holding modules are (namespace) packages too
            parent = name.rpartition(".")[0]
            while parent:
                self.packages.add(parent)
                parent = parent.rpartition(".")[0]

    def is_tree_module(self, name: str) -> bool:
        return name in self.files or name in self.packages

    def is_tree_name(self, name: str) -> bool:
        """Whether ``name`` lives in the tree (a module or something inside one)."""
        return self._tree_prefix(name) is not None

    def _tree_prefix(self, name: str) -> str | None:
        while name:
            if self.is_tree_module(name):
                return name
            name = name.rpartition(".")[0]
        return None

    def resolve_import(self, importer: str, is_package: bool, module: str | None, level: int) -> str:
        """The absolute name ``from <level dots><module> import ...`` / ``import <module>`` refers to.

        ``importer`` is the importing module's dotted name (``is_package`` when it is an ``__init__``).
        """
        if level:
            package = importer if is_package else importer.rpartition(".")[0]
            for _ in range(level - 1):
                package = package.rpartition(".")[0]
            return ".".join(p for p in (package, module) if p)
        assert module is not None
        top = module.split(".")[0]
        if self.is_tree_module(top):
            return module
        # a script's own directory is on sys.path when it runs
        script_dir = importer if is_package else importer.rpartition(".")[0]
        if script_dir and self.is_tree_module(f"{script_dir}.{top}"):
            return f"{script_dir}.{module}"
        return module

    @lru_cache(maxsize=None)
    def exports(self, module: str) -> Exports:
        """Top-level names bound in tree module ``module`` (empty for namespace packages)."""
        exports = Exports()
        rel = self.files.get(module)
        if rel is None:
            return exports
        try:
            data = (self.root / rel).read_bytes()
            if self.reexport_words is not None and not any(w in data for w in self.reexport_words):
                return exports
            tree = ast.parse(data)
        except (SyntaxError, ValueError, OSError):
            return exports
        is_package = rel.name == "__init__.py"
        for node in _top_level_statements(tree.body):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    source = self.resolve_import(module, is_package, alias.name, 0)
                    local, bound = import_binding(alias, source)
                    exports.imported[local] = bound
            elif isinstance(node, ast.ImportFrom):
                source = self.resolve_import(module, is_package, node.module, node.level)
                for alias in node.names:
                    if alias.name == "*":
                        exports.star_sources.append(source)
                    else:
                        exports.imported[alias.asname or alias.name] = f"{source}.{alias.name}"
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                exports.defined.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for name in ast.walk(target):
                        if isinstance(name, ast.Name):
                            exports.defined.add(name.id)
        # a name both imported and (re)defined is the module's own
        for name in exports.defined:
            exports.imported.pop(name, None)
        return exports

    def canonical(self, name: str, _depth: int = 0) -> tuple[str, bool]:
        """Follow tree re-exports: ``(defining name, whether a tree module re-exported it)``."""
        module = self._tree_prefix(name)
        if module is None or module == name or _depth > 20:
            return name, False
        head, _, tail = name[len(module) + 1:].partition(".")
        exports = self.exports(module)
        source = exports.imported.get(head)
        if source is None and head not in exports.defined:
            source = self._from_star(exports, head)
        if source is None:
            return name, False
        resolved, _ = self.canonical(f"{source}.{tail}" if tail else source, _depth + 1)
        return resolved, True

    def _from_star(self, exports: Exports, head: str) -> str | None:
        for star in reversed(exports.star_sources):
            if self.is_tree_module(star):
                inner = self.exports(star)
                if head in inner.defined or head in inner.imported or self.is_tree_module(f"{star}.{head}"):
                    return f"{star}.{head}"
        return None


def import_binding(alias: ast.alias, resolved: str) -> tuple[str, str]:
    """``(local name, fully-qualified name it is bound to)`` for one alias of ``import a.b.c [as z]``.

    Without ``as``, ``import a.b.c`` binds ``a``: the resolved name cut back to its first written part.
    """
    if alias.asname:
        return alias.asname, resolved
    parts = resolved.split(".")
    return alias.name.split(".")[0], ".".join(parts[: len(parts) - alias.name.count(".")])


def _top_level_statements(body: list[ast.stmt]):
    """Module-level statements, looking inside if/try/with blocks (not functions or classes)."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.With, ast.AsyncWith, ast.For, ast.While)):
            yield from _top_level_statements(node.body)
            yield from _top_level_statements(getattr(node, "orelse", []))
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _top_level_statements(block)
