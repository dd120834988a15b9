"""Migrate one file: resolve every name against the rules, then rewrite only what must change.

Analysis runs on the stdlib ``ast``, a C parser: building full libcst trees
for THUDM/GLM takes longer than this whole tool (``bench/codemod_speed.py
--baseline``). Each rewrite is a libcst transformation of the one statement
or call it touches (``migrate.rewrite``), spliced back by exact source
offsets, so every untouched byte stays as it was, by construction.

Steps, per file, one module each:

1. bind (``context``): which import each name comes from, and what that import becomes;
2. calls (``calls``): ``call`` rules (callee and arguments), ``argument`` and ``method`` rules (``x.cuda()``),
   and the literal name in ``importlib.import_module("name")``;
3. references (``references``): every dotted name rooted at an import, respelled where its
   rule maps it elsewhere than the rewritten import already does;
4. imports (``imports``): rewritten onto shim, dropped once nothing uses them, ``import shim``
   added once if needed.

A call site libcst cannot take is reported at its line with its rule and why, and left as it is
(keeping the imports it reads); the rest of the file is still migrated.

``edits`` splices the planned edits into the text. Which rule kinds exist, and where each
applies, is the table in ``migrate.kinds``.
"""

from __future__ import annotations

import ast

from migrate.codemod.calls import CallRewrites
from migrate.codemod.context import FileContext
from migrate.codemod.edits import Edit, Lines, RewriteError, splice
from migrate.codemod.imports import ImportRewrites
from migrate.codemod.references import ReferenceRewrites
from migrate.index import ModuleIndex
from migrate.report import FileReport
from migrate.rules import RuleSet

__all__ = ["Edit", "FileMigration", "Lines", "RewriteError", "migrate_source", "splice"]


def migrate_source(source: str, path: str, module: str, is_package: bool, index: ModuleIndex,
                   rules: RuleSet) -> tuple[str, FileReport]:
    """The migrated text of one file and its report (the text is ``source`` when nothing changes)."""
    report = FileReport(path)
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError) as exc:
        line = f" (line {exc.lineno})" if getattr(exc, "lineno", None) else ""
        report.error = f"{type(exc).__name__}: {getattr(exc, 'msg', exc)}{line}"
        return source, report
    try:
        return FileMigration(source, tree, module, is_package, index, rules, report).run(), report
    except RewriteError as exc:  # a planning bug (overlapping edits): the file stays whole
        return source, FileReport(path, error=str(exc))


class FileMigration:
    """One file's migration: the planners in order on one shared :class:`FileContext`, then the splice."""

    def __init__(self, source, tree, module, is_package, index: ModuleIndex, rules: RuleSet, report: FileReport):
        self.ctx = FileContext(source, tree, module, is_package, index, rules, report)

    def run(self) -> str:
        ctx = self.ctx
        CallRewrites(ctx).plan()
        ReferenceRewrites(ctx).plan()
        imports = ImportRewrites(ctx)
        imports.plan()
        imports.plan_added()
        result = splice(ctx.source, ctx.edits) if ctx.edits else ctx.source
        for entries in (ctx.report.changes, ctx.report.unconverted, ctx.report.kept):
            entries.sort(key=lambda e: e["line"])
        return result
