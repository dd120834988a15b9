"""What the rewrites of one file share: its names, its planned edits, its report.

:class:`FileContext` knows which import a dotted name starts from (``resolve``), what an
import is bound to once rewritten (``new_source``), how code at a line can spell a
target (``spell``), and records changes, constructs left alone, and edits. The
planners (``calls``, ``references``, ``imports``) read and add to it.
"""

from __future__ import annotations

import ast
from collections import Counter
from typing import Callable

import libcst as cst

from migrate.codemod.edits import Edit, Lines
from migrate.index import ModuleIndex
from migrate.report import FileReport
from migrate.rules import Rule, RuleSet, mapped_name
from migrate.scopes import Chain, ImportBinding, Scope, collect


def cannot(text: str, exc: Exception) -> str:
    """The report's reason for a site left as it is: its first line and libcst's first word on it."""
    first = text.strip().splitlines()[0] if text.strip() else text
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    more = "..." if len(first) > 60 or "\n" in text.strip() else ""
    return f"cannot rewrite `{first[:60]}{more}` ({reason}): left as it is"


class FileContext:
    def __init__(self, source, tree, module, is_package, index: ModuleIndex, rules: RuleSet, report: FileReport):
        self.source, self.tree, self.index, self.rules, self.report = source, tree, index, rules, report
        self.module, self.is_package = module, is_package
        self.text = Lines(source)
        self.scopes = collect(tree, index, module, is_package, frozenset(rules.methods))
        self.edits: list[Edit] = []
        self.handled: set[int] = set()  # ids of call callees rewritten with their call
        self.consumed: Counter[str] = Counter()  # name -> reads removed by rewrites
        self.consumed_by: dict[str, str] = {}  # name -> code of the last rule that removed a read
        self.spelled: Counter[str] = Counter()  # name -> reads added by rewrites
        self.added_imports: dict[str, None] = {}
        self.stars: dict[str, ImportBinding | None] = {}
        self.new_source = {b: self._new_source(b) for b in self.scopes.imports}

    # -- names ----------------------------------------------------------------
    def _new_source(self, binding: ImportBinding) -> str:
        """What ``binding`` is bound to once its import is rewritten."""
        if self.index.is_tree_name(binding.source):
            return binding.source
        rule = self.rules.best(binding.source)
        return (mapped_name(rule, binding.source) if rule else None) or binding.source

    def _star_binding(self, name: str) -> ImportBinding | None:
        """A free name supplied by a module-level ``from m import *``, if the rules or the tree know it."""
        if name not in self.stars:
            self.stars[name] = None
            for source, stmt in reversed(self.scopes.module.stars):
                fqn = f"{source}.{name}"
                if self.index.is_tree_name(source):
                    known = self.index.canonical(fqn)[1] or self.index.is_tree_module(fqn) or \
                        name in self.index.exports(source).defined
                else:
                    known = self.rules.best(fqn) is not self.rules.best(source)
                if known:
                    binding = ImportBinding(name, fqn, stmt, None, self.scopes.module)
                    rule = None if self.index.is_tree_name(source) else self.rules.best(source)
                    new_module = (mapped_name(rule, source) if rule else None) or source
                    self.new_source[binding] = f"{new_module}.{name}"  # what the rewritten star import supplies
                    self.stars[name] = binding
                    break
        return self.stars[name]

    def resolve(self, chain: Chain) -> tuple[ImportBinding, str] | None:
        """The import a dotted name starts from, and the fully-qualified name it reads."""
        root = chain.parts[0]
        binding = chain.scope.import_of(root)
        if binding is None:
            if chain.scope.lookup(root) is not None:
                return None  # the user's own name
            binding = self._star_binding(root)
            if binding is None:
                return None
        return binding, ".".join((binding.source, *chain.parts[1:]))

    def spell(self, target: str, scope: Scope, line: int, prefer: str | None = None) -> str:
        """How code at ``line`` in ``scope`` names ``target``: through the name ``prefer`` if it can,
        else the shortest way; ``import <root>`` is added if no import reaches it. Star imports are
        not used: what ``import *`` supplies depends on the module's ``__all__``."""
        if target.startswith("builtins."):
            return target[len("builtins."):]
        wanted = {target, self.index.canonical(target)[0]}
        candidates = []
        for binding in self.scopes.imports:
            if scope.import_of(binding.name) is not binding or not self._only_imports(binding):
                continue
            if scope is binding.scope and binding.stmt.lineno > line:
                continue  # not bound yet when this line runs
            new = self.new_source[binding]
            for name in wanted:
                if name == new or name.startswith(new + "."):
                    candidates.append(binding.name + name[len(new):])
                elif self.index.canonical(new)[0] == name:
                    candidates.append(binding.name)
        if candidates:
            spelled = min(candidates, key=lambda c: (c.split(".")[0] != prefer, len(c)))
        else:
            self.added_imports[target.split(".")[0]] = None
            spelled = target
        self.spelled[spelled.split(".")[0]] += 1
        return spelled

    @staticmethod
    def _only_imports(binding: ImportBinding) -> bool:
        """Whether the name is bound by imports alone (not also by a fallback ``class``, say)."""
        return all(isinstance(b, ImportBinding) for b in binding.scope.names[binding.name])

    def consume(self, name: str, code: str) -> None:
        """One read of ``name`` was rewritten away by rule ``code``."""
        self.consumed[name] += 1
        self.consumed_by[name] = code

    def defines(self, name: str, rule: Rule) -> bool:
        """Whether this file is in the tree package that defines ``name``: ``mpu/`` and its own
        tests keep calling ``mpu``'s implementation (``mpu.cross_entropy.f``: the package ``mpu``),
        ``megatron/fused_kernels/`` its own ``load`` (``megatron.fused_kernels.load``: defined in a
        package, that package) while ``megatron/initialize.py`` is migrated. A rule with
        ``args.scope = "module"`` leaves only the defining module's own calls alone."""
        if not self.index.is_tree_name(name):
            return False
        defining = self.index._tree_prefix(name)
        if rule.args.get("scope") == "module":
            return self.module == defining
        package = defining if defining in self.index.packages else defining.rpartition(".")[0] or defining
        return self.module == package or self.module.startswith(package + ".")

    # -- report ---------------------------------------------------------------
    def change(self, line: int, rule: Rule, before: str, after: str, target: str) -> dict:
        entry = {"line": line, "code": rule.code, "before": before, "after": after, "target": target}
        self.report.changes.append(entry)
        return entry

    def leave(self, line: int, rule: Rule, reason: str | None = None) -> None:
        """``rule``'s construct at ``line`` stays as it is: unconverted, or kept on purpose (``report`` rules)."""
        entries = getattr(self.report, rule.spec.reported or "unconverted")
        entry = {"line": line, "code": rule.code, "reason": reason or rule.note}
        if entry not in entries:
            entries.append(entry)

    def rule(self, code: str) -> Rule:
        return next(r for r in self.rules.rules if r.code == code)

    # -- edits ----------------------------------------------------------------
    def edit(self, node: ast.AST, render: Callable[[str], str], entries: list[dict] = ()) -> None:
        """Replace ``node``'s text by ``render(text)``; the result is also each entry's ``after``.
        A site libcst cannot take stays as it is and is reported (line, rule, why); the rest of the
        file is still migrated."""
        start, end = self.text.span(node)

        def rendered(text: str) -> str:
            try:
                result = render(text)
            except (cst.ParserSyntaxError, ValueError) as exc:
                for entry in entries:
                    if entry in self.report.changes:
                        self.report.changes.remove(entry)
                    self.leave(node.lineno, self.rule(entry["code"]), cannot(text, exc))
                return text
            for entry in entries:
                entry["after"] = result
            return result

        self.edits.append(Edit(start, end, rendered))

    def checked(self, node: ast.AST, rule: Rule, render: Callable[[str], str]) -> Callable[[str], str] | None:
        """``render``, once it has rewritten the site's own text; else None, with the site reported
        (line, rule, why) as unconverted, before any import is dropped on its account."""
        segment = self.segment(node)
        try:
            result = render(segment)
        except (cst.ParserSyntaxError, ValueError) as exc:
            self.leave(node.lineno, rule, cannot(segment, exc))
            return None
        return lambda text: result if text == segment else render(text)

    def segment(self, node: ast.AST) -> str:
        start, end = self.text.span(node)
        return self.source[start:end]
