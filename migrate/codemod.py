"""Migrate one file: resolve every name against the rules, then rewrite only what must change.

Analysis runs on the stdlib ``ast``, a C parser: building full libcst trees
for THUDM/GLM takes longer than this whole tool (``bench/codemod_speed.py
--baseline``). Each rewrite is a libcst transformation of the one statement
or call it touches (``migrate.rewrite``), spliced back by exact source
offsets, so every untouched byte stays as it was, by construction.

Steps, per file:

1. bind: which import each name comes from, and what that import becomes;
2. calls: ``call`` rules (callee and arguments) and ``method`` rules (``x.cuda()``);
3. references: every dotted name rooted at an import, respelled where its
   rule maps it elsewhere than the rewritten import already does;
4. imports: rewritten onto shim, dropped once nothing uses them, ``import shim`` added once if needed.
"""

from __future__ import annotations

import ast
import io
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable

import libcst as cst

from migrate.index import ModuleIndex
from migrate.report import FileReport
from migrate.rewrite import (ArgEdits, NewAlias, receiver_as_argument, rewrite_call, rewrite_import,
                             rewrite_import_from)
from migrate.rules import Rule, RuleSet, mapped_name
from migrate.scopes import Chain, ImportBinding, Scope, collect, dotted_parts

_TEMPLATE = re.compile(r"\{([A-Za-z_][\w.]*)\}")


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
        return _FileMigration(source, tree, module, is_package, index, rules, report).run(), report
    except RewriteError as exc:  # a planning bug (overlapping edits): the file stays whole
        return source, FileReport(path, error=str(exc))


def _cannot(text: str, exc: Exception) -> str:
    first = text.strip().splitlines()[0] if text.strip() else text
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return f"cannot rewrite `{first[:60]}{'...' if len(first) > 60 or chr(10) in text.strip() else ''}` ({reason}): left as it is"


class RewriteError(Exception):
    """libcst could not take a statement or call the plan asked to rewrite."""


@dataclass(eq=False)
class _Edit:
    start: int
    end: int
    render: Callable[[str], str]  # the span's text (inner edits applied) -> its replacement
    children: list["_Edit"] = field(default_factory=list)

    def contains(self, other: "_Edit") -> bool:
        if other.start == other.end and other.start in (self.start, self.end):
            return False  # an insertion at a boundary is beside a span, not in it
        return self.start <= other.start and other.end <= self.end


def splice(source: str, edits: list[_Edit]) -> str:
    """Apply edits by offset, inner edits first; text outside every edit is copied as it is."""
    roots: list[_Edit] = []
    stack: list[_Edit] = []
    for edit in sorted(edits, key=lambda e: (e.start, e.start != e.end, -e.end)):
        while stack and not stack[-1].contains(edit):
            stack.pop()
        siblings = stack[-1].children if stack else roots
        if siblings and edit.start < siblings[-1].end:  # overlapping without nesting: a planning bug
            raise RewriteError(f"overlapping rewrites at offset {edit.start}")
        siblings.append(edit)
        stack.append(edit)

    def render(start: int, end: int, children: list[_Edit]) -> str:
        out, position = [], start
        for child in children:
            out.append(source[position:child.start])
            out.append(child.render(render(child.start, child.end, child.children)))
            position = child.end
        out.append(source[position:end])
        return "".join(out)

    return render(0, len(source), roots)


class _Lines:
    """Offsets into the source for ``ast`` positions (whose columns count UTF-8 bytes)."""

    def __init__(self, source: str):
        self.lines = io.StringIO(source, newline="").readlines()
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))
        first = self.lines[0] if self.lines else "\n"
        self.newline = "\r\n" if first.endswith("\r\n") else "\r" if first.endswith("\r") else "\n"

    def offset(self, lineno: int, col: int) -> int:
        line = self.lines[lineno - 1] if lineno <= len(self.lines) else ""
        if not line.isascii():
            col = len(line.encode("utf-8")[:col].decode("utf-8", "replace"))
        return self.starts[lineno - 1] + col

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def column(self, node: ast.AST) -> int:
        """Where ``node`` starts on its line, in characters."""
        return self.offset(node.lineno, node.col_offset) - self.starts[node.lineno - 1]

    def line_start(self, lineno: int) -> int:
        return self.starts[min(lineno, len(self.starts)) - 1]


class _FileMigration:
    def __init__(self, source, tree, module, is_package, index: ModuleIndex, rules: RuleSet, report: FileReport):
        self.source, self.tree, self.index, self.rules, self.report = source, tree, index, rules, report
        self.module, self.is_package = module, is_package
        self.text = _Lines(source)
        self.scopes = collect(tree, index, module, is_package, frozenset(rules.methods))
        self.edits: list[_Edit] = []
        self.handled: set[int] = set()  # ids of call callees rewritten with their call
        self.consumed: Counter[str] = Counter()  # name -> reads removed by rewrites
        self.consumed_by: dict[str, str] = {}  # name -> code of the last rule that removed a read
        self.spelled: Counter[str] = Counter()  # name -> reads added by rewrites
        self.added_imports: dict[str, None] = {}
        self.stars: dict[str, ImportBinding | None] = {}
        self.new_source = {b: self._new_source(b) for b in self.scopes.imports}

    def run(self) -> str:
        self._plan_calls()
        self._plan_references()
        self._plan_imports()
        self._plan_added_imports()
        result = splice(self.source, self.edits) if self.edits else self.source
        for entries in (self.report.changes, self.report.unconverted, self.report.kept):
            entries.sort(key=lambda e: e["line"])
        return result

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

    def _resolve(self, chain: Chain) -> tuple[ImportBinding, str] | None:
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

    def _spell(self, target: str, scope: Scope, line: int, prefer: str | None = None) -> str:
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

    def _consume(self, name: str, code: str) -> None:
        self.consumed[name] += 1
        self.consumed_by[name] = code

    # -- report ---------------------------------------------------------------
    def _change(self, line: int, rule: Rule, before: str, after: str, target: str) -> dict:
        entry = {"line": line, "code": rule.code, "before": before, "after": after, "target": target}
        self.report.changes.append(entry)
        return entry

    def _leave(self, line: int, rule: Rule, reason: str | None = None) -> None:
        entries = self.report.unconverted if rule.kind != "report" else self.report.kept
        entry = {"line": line, "code": rule.code, "reason": reason or rule.note}
        if entry not in entries:
            entries.append(entry)

    def _edit(self, node: ast.AST, render: Callable[[str], str], entries: list[dict] = ()) -> None:
        """Replace ``node``'s text by ``render(text)``; the result is also each entry's ``after``."""
        start, end = self.text.span(node)

        def rendered(text: str) -> str:
            try:
                result = render(text)
            except (cst.ParserSyntaxError, ValueError) as exc:
                # This site stays as it is and is reported; the rest of the file is still migrated.
                for entry in entries:
                    if entry in self.report.changes:
                        self.report.changes.remove(entry)
                    self._leave(node.lineno, self._rule(entry["code"]), _cannot(text, exc))
                return text
            for entry in entries:
                entry["after"] = result
            return result

        self.edits.append(_Edit(start, end, rendered))

    def _segment(self, node: ast.AST) -> str:
        start, end = self.text.span(node)
        return self.source[start:end]

    # -- calls ----------------------------------------------------------------
    def _plan_calls(self) -> None:
        for call, scope in self.scopes.calls:
            found = dotted_parts(call.func)
            if found is not None:
                chain = Chain(call.func, found[0], found[1], scope)
                resolved = self._resolve(chain)
                if resolved is not None:
                    canonical = self.index.canonical(resolved[1])[0]
                    if canonical == "importlib.import_module":
                        self._import_module_call(call)
                        continue
                    rule = self.rules.calls.get(canonical)
                    if rule is not None and not self._defines(canonical, rule):
                        self._call(call, chain, rule)
                        continue
                    rule = self.rules.arguments.get(canonical)
                    if rule is not None and self.scopes.keyword_of.get(id(call)) == rule.args["keyword"] \
                            and not call.args and not call.keywords:
                        self._argument(call, chain, rule)
                        continue
            if isinstance(call.func, ast.Attribute) and call.func.attr in self.rules.methods \
                    and not self._is_library_name(call.func.value, scope):
                self._method(call, scope, self.rules.methods[call.func.attr])

    def _import_module_call(self, call: ast.Call) -> None:
        """``importlib.import_module("name")`` with a literal absolute name: the name is mapped as an
        ``import name`` would be (Megatron loads ``fused_mix_prec_layer_norm_cuda`` this way)."""
        if not call.args or call.keywords or len(call.args) > 1:
            return
        literal = call.args[0]
        if not (isinstance(literal, ast.Constant) and isinstance(literal.value, str)) or literal.value.startswith("."):
            return
        name = literal.value
        if self.index.is_tree_name(name):
            return
        rule = self.rules.best(name)
        if rule is None or rule.kind not in ("module", "symbol", "unsupported", "report"):
            return
        wanted = mapped_name(rule, name)
        if wanted is None:
            self._leave(call.lineno, rule)
            return
        if wanted == name:
            return
        quote = self._segment(literal)[:1]
        after = f"{quote}{wanted}{quote}" if quote in ("'", '"') else repr(wanted)
        self._change(call.lineno, rule, self._segment(literal), after, wanted)
        self._edit(literal, lambda _text: after)

    def _is_library_name(self, node: ast.expr, scope: Scope) -> bool:
        """Whether ``node`` names a library's module or class (``torch.nn.Module.cuda(self)`` is no method call)."""
        found = dotted_parts(node)
        binding = found and scope.import_of(found[0].id)
        return bool(binding) and not self.index.is_tree_name(binding.source)

    def _defines(self, name: str, rule: Rule) -> bool:
        """Whether this file is in the tree package that defines ``name``: ``mpu/`` and its own
        tests keep calling ``mpu``'s implementation (``mpu.cross_entropy.f``: the package ``mpu``),
        ``megatron/fused_kernels/`` its own ``load`` (``megatron.fused_kernels.load``: defined in a
        package, that package) while ``megatron/initialize.py`` is migrated."""
        if not self.index.is_tree_name(name):
            return False
        defining = self.index._tree_prefix(name)
        if rule.args.get("scope") == "module":  # only the defining module keeps its own calls
            return self.module == defining
        package = defining if defining in self.index.packages else defining.rpartition(".")[0] or defining
        return self.module == package or self.module.startswith(package + ".")

    def _unmappable(self, call: ast.Call, rule: Rule) -> bool:
        """``f(*args, **kwargs)``: which parameter each argument is cannot be known, so it is reported."""
        if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
            self._leave(call.lineno, rule, f"called with *args/**kwargs: not rewritten; {rule.note}")
            return True
        return False

    def _call(self, call: ast.Call, chain: Chain, rule: Rule) -> None:
        self.handled.add(id(call.func))
        if self._unmappable(call, rule):
            return
        func = self._spell(rule.target, chain.scope, call.lineno)
        add = {
            keyword: _TEMPLATE.sub(lambda m: self._spell(m[1], chain.scope, call.lineno), template)
            for keyword, template in rule.args.get("add", {}).items()
        }
        edits = ArgEdits.from_rule(rule.args, add)
        column = self.text.column(call)
        render = self._checked(call, rule, lambda text: rewrite_call(text, edits, func=func, column=column))
        if render is None or render(self._segment(call)) == self._segment(call):
            return  # unrewritable (reported), or already as the rule wants it (allow_no_cuda=True given)
        self._consume(chain.root.id, rule.code)
        entry = self._change(call.lineno, rule, self._segment(call), "", rule.target)
        self._edit(call, render, [entry])

    def _argument(self, call: ast.Call, chain: Chain, rule: Rule) -> None:
        self.handled.add(id(call.func))
        value = self._spell(rule.target, chain.scope, call.lineno) + "()"
        self._consume(chain.root.id, rule.code)
        self._change(call.lineno, rule, self._segment(call), value, rule.target + "()")
        self._edit(call, lambda _text: value)

    def _method(self, call: ast.Call, scope: Scope, rule: Rule) -> None:
        if self._unmappable(call, rule):
            return
        if rule.args.get("receiver") == "argument":  # x.type(...) -> target(x, ...)
            func = self._spell(rule.target, scope, call.lineno)
            render = self._checked(call, rule, lambda text: receiver_as_argument(text, func))
            if render is not None:
                self._edit(call, render, [self._change(call.lineno, rule, self._segment(call), "", rule.target)])
            return
        first = self._spell(rule.target, scope, call.lineno) + "()"
        edits = ArgEdits.from_rule(rule.args)
        method = rule.args.get("method", rule.match)
        render = self._checked(call, rule, lambda text: rewrite_call(text, edits, method=method, first=first))
        if render is None:
            return
        entry = self._change(call.lineno, rule, self._segment(call), "", rule.target + "()")
        self._edit(call, render, [entry])

    def _checked(self, node: ast.AST, rule: Rule, render: Callable[[str], str]) -> Callable[[str], str] | None:
        """``render``, once it has rewritten the site's own text; else None, with the site reported
        (line, rule, why) as unconverted, before any import is dropped on its account."""
        segment = self._segment(node)
        try:
            result = render(segment)
        except (cst.ParserSyntaxError, ValueError) as exc:
            self._leave(node.lineno, rule, _cannot(segment, exc))
            return None
        return lambda text: result if text == segment else render(text)

    # -- references -----------------------------------------------------------
    def _plan_references(self) -> None:
        for chain in self.scopes.chains:
            if id(chain.node) in self.handled:
                continue
            resolved = self._resolve(chain)
            if resolved is None:
                continue
            binding, name = resolved
            canonical, re_exported = self.index.canonical(name)
            line = chain.node.lineno
            if self.index.is_tree_name(canonical):
                call_rule = self.rules.calls.get(canonical)
                if call_rule is not None and not self._defines(canonical, call_rule):
                    self._leave(line, call_rule, f"used as a value, not called: not rewritten; {call_rule.note}")
                continue
            if re_exported:
                continue  # the tree module re-exporting it is migrated itself
            rule = self.rules.best(canonical)
            if rule is None:
                continue
            if rule.kind in ("unsupported", "report"):
                self._leave(line, rule)
                continue
            wanted = mapped_name(rule, canonical)
            current = self.new_source[binding] + name[len(binding.source):]
            before = chain.dotted
            if wanted == current:
                if rule is not self.rules.best(binding.source):
                    self._change(line, rule, before, before, wanted)
                continue
            if chain.in_fstring:
                self._leave(line, rule, f"inside an f-string: not rewritten; {rule.note}")
                continue
            spelled = self._spell(wanted, chain.scope, line, prefer=chain.parts[0])
            self._consume(chain.root.id, rule.code)
            self._change(line, rule, before, spelled, wanted)
            self._edit(chain.node, lambda _text, spelled=spelled: spelled)

    # -- imports --------------------------------------------------------------
    def _unused(self, binding: ImportBinding) -> bool:
        """Whether every read of this import's name was rewritten away."""
        name = binding.name
        if not self.consumed[name]:
            return False
        return self.scopes.name_loads.get(name, 0) - self.consumed[name] + self.spelled[name] <= 0

    def _plan_imports(self) -> None:
        by_statement: dict[int, list[ImportBinding]] = {}
        for binding in self.scopes.imports:
            by_statement.setdefault(id(binding.stmt), []).append(binding)
        seen_at_top: set[tuple[str, str | None]] = set()
        removed: list[ast.stmt] = []
        for stmt in self._import_statements():
            bindings = by_statement.get(id(stmt), [])
            at_top = self.scopes.container.get(id(stmt)) is self.tree.body
            if isinstance(stmt, ast.Import):
                gone = self._plan_import(stmt, bindings, seen_at_top if at_top else None)
            else:
                gone = self._plan_import_from(stmt, bindings)
            if gone:
                removed.append(stmt)
        self._remove_statements(removed)

    def _import_statements(self) -> list[ast.stmt]:
        found = {id(b.stmt): b.stmt for b in self.scopes.imports}
        found.update({id(s): s for _, s in self.scopes.module.stars})
        return sorted(found.values(), key=lambda s: (s.lineno, s.col_offset))

    def _leave_import(self, line: int, source: str) -> None:
        if self.index.is_tree_name(source):
            return
        rule = self.rules.best(source)
        if rule is not None and rule.kind in ("unsupported", "report"):
            self._leave(line, rule)

    def _plan_import(self, stmt: ast.Import, bindings: list[ImportBinding], seen_at_top) -> bool:
        """Rewrite ``import a.b as c`` onto shim; True when the whole statement goes away."""
        aliases, extra, codes = [], [], {}
        for alias, binding in zip(stmt.names, bindings):
            if self._unused(binding):
                aliases.append(NewAlias(alias.name, alias.asname, removed=True))
                codes.setdefault(self.consumed_by[binding.name], None)
                continue
            new = self.new_source[binding]
            full = binding.source if alias.asname else binding.source + alias.name[len(binding.name):]
            rule = self.rules.best(full)
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
            source = self.index.resolve_import(self.module, self.is_package, stmt.module, stmt.level)
            rule = None if self.index.is_tree_name(source) else self.rules.best(source)
            new = mapped_name(rule, source) if rule else None
            if new is None:
                self._leave_import(stmt.lineno, source)
                return False
            codes[rule.code] = None
            groups[new] = []
        for position, (alias, binding) in enumerate(zip(stmt.names, bindings)):
            new = self.new_source[binding]
            module, _, name = new.rpartition(".")
            if new == binding.source:
                module, name = None, alias.name
            if self._unused(binding):
                groups.setdefault(module, []).append(NewAlias(name, None, removed=True, position=position))
                codes.setdefault(self.consumed_by[binding.name], None)
                continue
            if module is None:
                self._leave_import(stmt.lineno, binding.source)
            else:
                codes.setdefault(self.rules.best(binding.source).code, None)
            asname = alias.asname or (alias.name if name != alias.name else None)
            groups.setdefault(module, []).append(NewAlias(name, asname, position=position))
        if not codes:
            return False
        if all(a.removed for aliases in groups.values() for a in aliases) and bindings:
            self._report_statement(stmt, codes, "")
            return True
        kept = [(m, a) for m, a in groups.items() if not a or not all(x.removed for x in a)]
        joiner = self.text.newline + self._indent(stmt)
        self._statement_edit(stmt, codes, lambda text: rewrite_import_from(text, kept, joiner))
        return False

    def _indent(self, stmt: ast.stmt) -> str:
        prefix = self.text.lines[stmt.lineno - 1][: self.text.column(stmt)]
        return prefix if not prefix.strip() else "; "

    def _report_statement(self, stmt: ast.stmt, codes: dict[str, None], after: str) -> list[dict]:
        before = self._segment(stmt)
        return [self._change(stmt.lineno, self._rule(code), before, after, "") for code in codes]

    def _rule(self, code: str) -> Rule:
        return next(r for r in self.rules.rules if r.code == code)

    def _statement_edit(self, stmt: ast.stmt, codes: dict[str, None], render: Callable[[str], str]) -> None:
        self._edit(stmt, render, self._report_statement(stmt, codes, ""))

    def _remove_statements(self, removed: list[ast.stmt]) -> None:
        gone = {id(s) for s in removed}
        for stmt in removed:
            container = self.scopes.container[id(stmt)]
            start, end = self.text.span(stmt)
            line_start = self.text.line_start(stmt.lineno)
            after_line = self.text.line_start(stmt.end_lineno + 1)
            before_text = self.source[line_start:start]
            after_text = self.source[end:after_line]
            alone = not before_text.strip() and (not after_text.strip() or after_text.lstrip().startswith("#"))
            first_of_emptied = container is not self.tree.body and all(id(s) in gone for s in container) \
                and stmt is container[0]
            if alone and not first_of_emptied:
                self.edits.append(_Edit(line_start, after_line, lambda _text: ""))
            else:
                self.edits.append(_Edit(start, end, lambda _text: "pass"))

    def _plan_added_imports(self) -> None:
        if not self.added_imports:
            return
        body = self.tree.body
        first = 1 if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str) else 0
        imports = [i for i in range(first, len(body)) if isinstance(body[i], (ast.Import, ast.ImportFrom))]
        newline = self.text.newline
        text = "".join(f"import {name}{newline}" for name in self.added_imports)
        if imports:
            last = imports[0]
            while last + 1 < len(body) and isinstance(body[last + 1], (ast.Import, ast.ImportFrom)):
                last += 1
            at = self.text.line_start(body[last].end_lineno + 1)
        elif first < len(body):
            at = self.text.line_start(body[first].lineno)
        else:
            at = len(self.source)
        if at == len(self.source) and self.source and not self.source.endswith(("\n", "\r")):
            text = newline + text
        self.edits.append(_Edit(at, at, lambda _text: text))
