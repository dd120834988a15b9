"""Imports: each import statement rewritten onto shim, one alias at a time (``import torch`` keeps
the name the code uses, ``from apex.optimizers import FusedAdam`` becomes ``from shim.optim import
FusedAdam``), dropped once every read of its name was rewritten away; ``import shim`` and the like
added once, after the module's imports, where a respelled name needs one."""

from __future__ import annotations

import ast
from typing import Callable

from migrate.codemod.context import FileContext
from migrate.codemod.edits import Edit
from migrate.rewrite import NewAlias, rewrite_import, rewrite_import_from
from migrate.rules import mapped_name
from migrate.scopes import ImportBinding


class ImportRewrites:
    def __init__(self, ctx: FileContext):
        self.ctx = ctx

    def _unused(self, binding: ImportBinding) -> bool:
        """Whether every read of this import's name was rewritten away."""
        name = binding.name
        if not self.ctx.consumed[name]:
            return False
        return self.ctx.scopes.name_loads.get(name, 0) - self.ctx.consumed[name] + self.ctx.spelled[name] <= 0

    def plan(self) -> None:
        by_statement: dict[int, list[ImportBinding]] = {}
        for binding in self.ctx.scopes.imports:
            by_statement.setdefault(id(binding.stmt), []).append(binding)
        seen_at_top: set[tuple[str, str | None]] = set()
        removed: list[ast.stmt] = []
        for stmt in self._import_statements():
            bindings = by_statement.get(id(stmt), [])
            at_top = self.ctx.scopes.container.get(id(stmt)) is self.ctx.tree.body
            if isinstance(stmt, ast.Import):
                gone = self._plan_import(stmt, bindings, seen_at_top if at_top else None)
            else:
                gone = self._plan_import_from(stmt, bindings)
            if gone:
                removed.append(stmt)
        self._remove_statements(removed)

    def _import_statements(self) -> list[ast.stmt]:
        found = {id(b.stmt): b.stmt for b in self.ctx.scopes.imports}
        found.update({id(s): s for _, s in self.ctx.scopes.module.stars})
        return sorted(found.values(), key=lambda s: (s.lineno, s.col_offset))

    def _leave_import(self, line: int, source: str) -> None:
        if self.ctx.index.is_tree_name(source):
            return
        rule = self.ctx.rules.best(source)
        if rule is not None and rule.spec.reported:
            self.ctx.leave(line, rule)

    def _plan_import(self, stmt: ast.Import, bindings: list[ImportBinding], seen_at_top) -> bool:
        """Rewrite ``import a.b as c`` onto shim; True when the whole statement goes away."""
        aliases, extra, codes = [], [], {}
        for alias, binding in zip(stmt.names, bindings):
            if self._unused(binding):
                aliases.append(NewAlias(alias.name, alias.asname, removed=True))
                codes.setdefault(self.ctx.consumed_by[binding.name], None)
                continue
            new = self.ctx.new_source[binding]
            full = binding.source if alias.asname else binding.source + alias.name[len(binding.name):]
            rule = self.ctx.rules.best(full)
            if new == binding.source:
                aliases.append(NewAlias(alias.name, alias.asname))
                self._leave_import(stmt.lineno, full)
            else:
                asname = binding.name if new != binding.name else None
                wanted = (mapped_name(rule, full) if rule else None) or full
                if not alias.asname and wanted != new + full[len(binding.source):]:
                    extra.append(wanted)  # `import torch._six` must still load what it maps to
                aliases.append(NewAlias(new, asname))
                codes.setdefault(rule.code, None)
            if seen_at_top is not None:
                key = (aliases[-1].name, aliases[-1].asname)
                if key in seen_at_top and (alias.name, alias.asname) not in seen_at_top:
                    aliases[-1].removed = True  # `import torch.distributed` and `import torch` both became this
                seen_at_top.update({key, (alias.name, alias.asname)})
        if not codes:
            return False
        if all(a.removed for a in aliases) and not extra:
            self._report_statement(stmt, codes, "")
            return True
        self._statement_edit(stmt, codes, lambda text: rewrite_import(text, aliases, extra))
        return False

    def _plan_import_from(self, stmt: ast.ImportFrom, bindings: list[ImportBinding]) -> bool:
        """Rewrite ``from m import a as b`` onto shim, one statement per new module; True when it goes away."""
        groups: dict[str | None, list[NewAlias]] = {}  # new module (None: unchanged) -> its aliases
        codes: dict[str, None] = {}
        if stmt.names[0].name == "*":
            source = self.ctx.index.resolve_import(self.ctx.module, self.ctx.is_package, stmt.module, stmt.level)
            rule = None if self.ctx.index.is_tree_name(source) else self.ctx.rules.best(source)
            new = mapped_name(rule, source) if rule else None
            if new is None:
                self._leave_import(stmt.lineno, source)
                return False
            codes[rule.code] = None
            groups[new] = []
        for position, (alias, binding) in enumerate(zip(stmt.names, bindings)):
            new = self.ctx.new_source[binding]
            module, _, name = new.rpartition(".")
            if new == binding.source:
                module, name = None, alias.name
            if self._unused(binding):
                groups.setdefault(module, []).append(NewAlias(name, None, removed=True, position=position))
                codes.setdefault(self.ctx.consumed_by[binding.name], None)
                continue
            if module is None:
                self._leave_import(stmt.lineno, binding.source)
            else:
                codes.setdefault(self.ctx.rules.best(binding.source).code, None)
            asname = alias.asname or (alias.name if name != alias.name else None)
            groups.setdefault(module, []).append(NewAlias(name, asname, position=position))
        if not codes:
            return False
        if all(a.removed for aliases in groups.values() for a in aliases) and bindings:
            self._report_statement(stmt, codes, "")
            return True
        kept = [(m, a) for m, a in groups.items() if not a or not all(x.removed for x in a)]
        joiner = self.ctx.text.newline + self._indent(stmt)
        self._statement_edit(stmt, codes, lambda text: rewrite_import_from(text, kept, joiner))
        return False

    def _indent(self, stmt: ast.stmt) -> str:
        prefix = self.ctx.text.lines[stmt.lineno - 1][: self.ctx.text.column(stmt)]
        return prefix if not prefix.strip() else "; "

    def _report_statement(self, stmt: ast.stmt, codes: dict[str, None], after: str) -> list[dict]:
        before = self.ctx.segment(stmt)
        return [self.ctx.change(stmt.lineno, self.ctx.rule(code), before, after, "") for code in codes]

    def _statement_edit(self, stmt: ast.stmt, codes: dict[str, None], render: Callable[[str], str]) -> None:
        self.ctx.edit(stmt, render, self._report_statement(stmt, codes, ""))

    def _remove_statements(self, removed: list[ast.stmt]) -> None:
        gone = {id(s) for s in removed}
        for stmt in removed:
            container = self.ctx.scopes.container[id(stmt)]
            start, end = self.ctx.text.span(stmt)
            line_start = self.ctx.text.line_start(stmt.lineno)
            after_line = self.ctx.text.line_start(stmt.end_lineno + 1)
            before_text = self.ctx.source[line_start:start]
            after_text = self.ctx.source[end:after_line]
            alone = not before_text.strip() and (not after_text.strip() or after_text.lstrip().startswith("#"))
            first_of_emptied = container is not self.ctx.tree.body and all(id(s) in gone for s in container) \
                and stmt is container[0]
            if alone and not first_of_emptied:
                self.ctx.edits.append(Edit(line_start, after_line, lambda _text: ""))
            else:
                self.ctx.edits.append(Edit(start, end, lambda _text: "pass"))

    def plan_added(self) -> None:
        if not self.ctx.added_imports:
            return
        body = self.ctx.tree.body
        first = 1 if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str) else 0
        imports = [i for i in range(first, len(body)) if isinstance(body[i], (ast.Import, ast.ImportFrom))]
        newline = self.ctx.text.newline
        text = "".join(f"import {name}{newline}" for name in self.ctx.added_imports)
        if imports:
            last = imports[0]
            while last + 1 < len(body) and isinstance(body[last + 1], (ast.Import, ast.ImportFrom)):
                last += 1
            at = self.ctx.text.line_start(body[last].end_lineno + 1)
        elif first < len(body):
            at = self.ctx.text.line_start(body[first].lineno)
        else:
            at = len(self.ctx.source)
        if at == len(self.ctx.source) and self.ctx.source and not self.ctx.source.endswith(("\n", "\r")):
            text = newline + text
        self.ctx.edits.append(Edit(at, at, lambda _text: text))
