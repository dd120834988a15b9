"""Which name means what, inside one file: import bindings, scopes and references.

A name used somewhere is looked up the way Python does (function scopes,
class bodies that nested functions skip, comprehensions, ``global``); only a
name whose binding is an import can be rewritten. A user's own ``all_reduce``
(a def, a parameter, an assignment) is never taken for torch's.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field

from migrate.index import ModuleIndex, import_binding


@dataclass(eq=False)
class ImportBinding:
    """One name bound by one import alias."""

    name: str
    source: str  # the fully-qualified name it is bound to, tree modules resolved
    stmt: ast.Import | ast.ImportFrom
    alias: ast.alias | None  # None: a name supplied by `from m import *`
    scope: "Scope"


OTHER = object()  # any binding that is not an import: def, class, parameter, assignment...


@dataclass(eq=False)
class Scope:
    kind: str  # module, function, class, comprehension
    parent: "Scope | None"
    names: dict[str, list] = field(default_factory=dict)
    global_names: set[str] = field(default_factory=set)
    stars: list[tuple[str, ast.ImportFrom]] = field(default_factory=list)

    def bind(self, name: str, binding) -> None:
        target = self.module if name in self.global_names else self
        target.names.setdefault(name, []).append(binding)

    @property
    def module(self) -> "Scope":
        scope = self
        while scope.parent is not None:
            scope = scope.parent
        return scope

    def lookup(self, name: str) -> tuple["Scope", list] | None:
        """The scope that binds ``name`` as seen from here, and its bindings there (None if free)."""
        scope, own = self, True
        while scope is not None:
            if name in scope.global_names:
                scope = self.module
            if (own or scope.kind != "class") and name in scope.names:
                return scope, scope.names[name]
            scope, own = scope.parent, False
        return None

    def import_of(self, name: str) -> ImportBinding | None:
        """The import binding ``name`` refers to from here, if it refers to one."""
        found = self.lookup(name)
        if found is None:
            return None
        return next((b for b in found[1] if isinstance(b, ImportBinding)), None)


@dataclass(eq=False)
class Chain:
    """A dotted reference rooted at a name: ``torch.cuda.synchronize``; ``node`` is its outermost node."""

    node: ast.expr
    root: ast.Name
    parts: tuple[str, ...]
    scope: Scope
    in_fstring: bool = False  # positions inside f-strings are not reliable enough to splice

    @property
    def dotted(self) -> str:
        return ".".join(self.parts)


@dataclass
class FileScopes:
    module: Scope
    imports: list[ImportBinding]
    chains: list[Chain]
    calls: list[tuple[ast.Call, Scope]]
    name_loads: dict[str, int]  # how often each name is read, anywhere in the file
    keyword_of: dict[int, str]  # id(call) -> the keyword it is passed as (``device=f()``), or the
    # parameter it is passed to positionally when the callee is a function the module itself defines
    container: dict[int, list[ast.stmt]]  # id(import statement) -> the statement list holding it
    assigned_to: dict[int, str] = field(default_factory=dict)  # id(call) -> the one name ``x = f()`` binds


def dotted_parts(node: ast.expr) -> tuple[ast.Name, tuple[str, ...]] | None:
    """``a.b.c`` -> (Name a, ("a", "b", "c")); None when not a plain dotted name."""
    attrs = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return node, (node.id, *reversed(attrs))


# nodes that never hold a name: not worth a visit
_LEAVES = (ast.expr_context, ast.operator, ast.unaryop, ast.cmpop, ast.boolop, ast.Constant)


class _Collector(ast.NodeVisitor):
    """One walk over the file. ``visit``/``generic_visit`` are ast.NodeVisitor's, made cheaper:
    the walk is most of the analysis time, so handlers are looked up once per node type."""

    _handlers: dict[type, object] = {}

    def visit(self, node: ast.AST) -> None:
        kind = type(node)
        handler = self._handlers.get(kind, _LEAVES)
        if handler is _LEAVES:
            handler = self._handlers[kind] = getattr(type(self), "visit_" + kind.__name__, None)
        if handler is None:
            self.generic_visit(node)
        else:
            handler(self, node)

    def generic_visit(self, node: ast.AST) -> None:
        for name in node._fields:
            value = getattr(node, name, None)
            if type(value) is list:
                for item in value:
                    if isinstance(item, ast.AST) and not isinstance(item, _LEAVES):
                        self.visit(item)
            elif isinstance(value, ast.AST) and not isinstance(value, _LEAVES):
                self.visit(value)

    def __init__(self, index: ModuleIndex, module: str, is_package: bool, roots: set[str] | None,
                 methods: frozenset[str]):
        self.index, self.module_name, self.is_package = index, module, is_package
        # only references rooted at these names (None: any, with a star import) or calls of these methods matter
        self.roots, self.methods = roots, methods
        self.scope = Scope("module", None)
        self.imports: list[ImportBinding] = []
        self.chains: list[Chain] = []
        self.calls: list[tuple[ast.Call, Scope]] = []
        self.keyword_of: dict[int, str] = {}
        self.assigned_to: dict[int, str] = {}
        self.local_functions: dict[str, list[str]] = {}  # module-level def -> its positional parameter names
        self.name_loads: dict[str, int] = {}
        self.in_fstring = 0

    # -- bindings -------------------------------------------------------------
    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            resolved = self.index.resolve_import(self.module_name, self.is_package, alias.name, 0)
            local, bound = import_binding(alias, resolved)
            self._bind_import(local, bound, node, alias)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        source = self.index.resolve_import(self.module_name, self.is_package, node.module, node.level)
        for alias in node.names:
            if alias.name == "*":
                self.scope.module.stars.append((source, node))
            else:
                self._bind_import(alias.asname or alias.name, f"{source}.{alias.name}", node, alias)

    def _bind_import(self, name, source, node, alias) -> None:
        binding = ImportBinding(name, source, node, alias, self.scope)
        self.imports.append(binding)
        self.scope.bind(name, binding)

    def visit_Global(self, node: ast.Global) -> None:
        self.scope.global_names.update(node.names)

    def _wanted(self, name: str) -> bool:
        return self.roots is None or name in self.roots

    def visit_Name(self, node: ast.Name) -> None:
        if not isinstance(node.ctx, ast.Load):
            self.scope.bind(node.id, OTHER)
        elif self._wanted(node.id):
            self.name_loads[node.id] = self.name_loads.get(node.id, 0) + 1
            self.chains.append(Chain(node, node, (node.id,), self.scope, self.in_fstring > 0))

    def visit_Attribute(self, node: ast.Attribute) -> None:
        found = dotted_parts(node)
        if found is None or not isinstance(found[0].ctx, ast.Load):
            self.generic_visit(node)
            return
        root, parts = found
        if self._wanted(root.id):
            self.name_loads[root.id] = self.name_loads.get(root.id, 0) + 1
            self.chains.append(Chain(node, root, parts, self.scope, self.in_fstring > 0))

    def visit_Assign(self, node: ast.Assign) -> None:
        if len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and isinstance(node.value, ast.Call):
            self.assigned_to[id(node.value)] = node.targets[0].id
        self.generic_visit(node)

    def visit_JoinedStr(self, node: ast.JoinedStr) -> None:
        self.in_fstring += 1
        self.generic_visit(node)
        self.in_fstring -= 1

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if not self.in_fstring and (isinstance(func, ast.Attribute) and func.attr in self.methods or (
                (found := dotted_parts(func)) is not None and self._wanted(found[0].id))):
            self.calls.append((node, self.scope))
        for keyword in node.keywords:
            if keyword.arg is not None and isinstance(keyword.value, ast.Call):
                self.keyword_of[id(keyword.value)] = keyword.arg
        params = self.local_functions.get(func.id) if isinstance(func, ast.Name) else None
        seen = params and self.scope.lookup(func.id)
        if seen and seen[0] is self.scope.module:  # the module's own def, not a local of the same name
            for arg, param in zip(node.args, params):
                if isinstance(arg, ast.Starred):
                    break
                if isinstance(arg, ast.Call):
                    self.keyword_of[id(arg)] = param
        self.generic_visit(node)

    def visit_ExceptHandler(self, node: ast.ExceptHandler) -> None:
        if node.name:
            self.scope.bind(node.name, OTHER)
        self.generic_visit(node)

    def visit_MatchAs(self, node) -> None:
        if node.name:
            self.scope.bind(node.name, OTHER)
        self.generic_visit(node)

    def visit_MatchStar(self, node) -> None:
        if node.name:
            self.scope.bind(node.name, OTHER)

    # -- scopes ---------------------------------------------------------------
    def _enter(self, kind: str) -> Scope:
        outer, self.scope = self.scope, Scope(kind, self.scope)
        return outer

    def _visit_function(self, node) -> None:
        if not isinstance(node, ast.Lambda):
            self.scope.bind(node.name, OTHER)
            for decorator in node.decorator_list:
                self.visit(decorator)
            if node.returns:
                self.visit(node.returns)
        args = node.args
        for default in (*args.defaults, *(d for d in args.kw_defaults if d is not None)):
            self.visit(default)
        every_arg = [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg]
        for arg in every_arg:
            if arg is not None and arg.annotation is not None:
                self.visit(arg.annotation)
        outer = self._enter("function")
        for arg in every_arg:
            if arg is not None:
                self.scope.bind(arg.arg, OTHER)
        for statement in node.body if isinstance(node.body, list) else [node.body]:
            self.visit(statement)
        self.scope = outer

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _visit_function

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scope.bind(node.name, OTHER)
        for expr in (*node.decorator_list, *node.bases, *node.keywords):
            self.visit(expr)
        outer = self._enter("class")
        for statement in node.body:
            self.visit(statement)
        self.scope = outer

    def _visit_comprehension(self, node) -> None:
        generators = node.generators
        self.visit(generators[0].iter)  # evaluated in the enclosing scope
        outer = self._enter("comprehension")
        for i, generator in enumerate(generators):
            if i:
                self.visit(generator.iter)
            self.visit(generator.target)
            for condition in generator.ifs:
                self.visit(condition)
        for field_name in ("elt", "key", "value"):
            if hasattr(node, field_name):
                self.visit(getattr(node, field_name))
        self.scope = outer

    visit_ListComp = visit_SetComp = visit_DictComp = visit_GeneratorExp = _visit_comprehension


def _import_statements(body: list[ast.stmt], found: list[tuple[ast.stmt, list[ast.stmt]]]) -> None:
    """Every import statement with the statement list holding it, without walking expressions."""
    for node in body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append((node, body))
        for field_name in ("body", "orelse", "finalbody"):
            inner = getattr(node, field_name, None)
            if isinstance(inner, list):
                _import_statements(inner, found)
        for handler in getattr(node, "handlers", ()):
            _import_statements(handler.body, found)
        for case in getattr(node, "cases", ()):
            _import_statements(case.body, found)


def collect(tree: ast.Module, index: ModuleIndex, module: str, is_package: bool,
            methods: frozenset[str] = frozenset()) -> FileScopes:
    """Bindings, scopes and the references that could matter: rooted at an imported name, or calls
    of ``methods``."""
    statements: list[tuple[ast.stmt, list[ast.stmt]]] = []
    _import_statements(tree.body, statements)
    roots: set[str] | None = set()
    for stmt, _ in statements:
        for alias in stmt.names:
            if alias.name == "*":
                roots = None  # any free name may come from it
                break
            roots.add(alias.asname or alias.name.split(".")[0])
        if roots is None:
            break
    collector = _Collector(index, module, is_package, roots, methods)
    collector.local_functions = {
        stmt.name: [a.arg for a in (*stmt.args.posonlyargs, *stmt.args.args)]
        for stmt in tree.body
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef))
    }
    collector.visit(tree)
    return FileScopes(collector.scope, collector.imports, collector.chains, collector.calls,
                      collector.name_loads, collector.keyword_of, {id(stmt): body for stmt, body in statements},
                      collector.assigned_to)
