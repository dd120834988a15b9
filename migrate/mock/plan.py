"""What glm-mock redirects, read from the rule tables (one mapping, two consumers).

The codemod rewrites ``apex.optimizers.FusedAdam`` to ``shim.optim.FusedAdam``; the
mock serves the same rule at import time. Only rules inside :data:`SCOPES` matter
here: the rest of torch (``torch.cuda``, ``.cuda()``...) is made portable by
``shim.compat.install()``, not by stand-in modules. The scopes, and the few names served
that no rule maps, are tables in ``rules/`` too (``[[mock_scope]]``, ``[[mock_defined]]``);
what each rule kind means to the mock is its ``mock`` entry in ``migrate.kinds``.
"""

from __future__ import annotations

import importlib
from functools import lru_cache
from typing import NamedTuple

from migrate.kinds import Mock
from migrate.rules import load_tables

# Read when the mock starts, before its finder is installed (so reading imports nothing through it).
_TABLES = load_tables()
# Module trees the mock can stand in for -> what to install to get the real thing.
SCOPES = {scope.name: scope.install for scope in _TABLES.mock_scopes}
# Names the mock serves that no rule maps -> what serves them.
MOCK_DEFINED = {defined.match: defined.target for defined in _TABLES.mock_defined}


class Redirect(NamedTuple):
    """One name under a scope: what backs it, or why nothing does."""

    name: str
    kind: str  # "module" (a stand-in forwarding to target), "symbol", or "not covered"
    target: str | None = None
    code: str = ""  # the rule code, "" for a mock_defined name
    note: str = ""


def scope_of(name: str) -> str | None:
    """The scope ``name`` lies in (``"apex"`` for ``apex.amp``), or None."""
    for scope in SCOPES:
        if name == scope or name.startswith(scope + "."):
            return scope
    return None


class Plan:
    """The redirections, indexed for the import finder and for ``glm-mock --list``."""

    def __init__(self, redirects: list[Redirect]):
        self.redirects = {r.name: r for r in redirects}
        served = [r.name for r in redirects if r.kind != "not covered"]
        # Every package above a served name is a stand-in module too (apex.optimizers for
        # apex.optimizers.FusedAdam), but never above its scope (no stand-in "torch").
        self.modules = {r.name for r in redirects if r.kind == "module"}
        for name in served:
            scope = scope_of(name)
            parts = name.split(".")
            for i in range(scope.count(".") + 1, len(parts)):
                self.modules.add(".".join(parts[:i]))

    def lookup(self, name: str) -> Redirect:
        """What backs ``name``; an uncovered name gets the note of its nearest enclosing rule."""
        found = self.redirects.get(name)
        if found is not None and found.kind != "not covered":
            return found
        prefix = name
        while prefix:
            rule = self.redirects.get(prefix)
            if rule is not None and rule.kind == "not covered":
                return Redirect(name, "not covered", code=rule.code, note=rule.note)
            prefix = prefix.rpartition(".")[0]
        return Redirect(name, "not covered", note="no rule maps it")

    def not_covered_message(self, name: str) -> str:
        redirect = self.lookup(name)
        code = f"[{redirect.code}] " if redirect.code else ""
        return (
            f"{name} is not covered by glm-mock: {code}{redirect.note} "
            f"(install {SCOPES[scope_of(name)]} to use it)"
        )


def _redirect(rule) -> Redirect:
    """What the mock does for ``rule``: its kind's ``mock`` entry in ``migrate.kinds.KINDS``."""
    mock = rule.spec.mock
    if mock is Mock.SYMBOL_IF_PLAIN:
        if not rule.args:
            return Redirect(rule.match, "symbol", rule.target, rule.code, rule.note)
        note = f"{rule.note} (its argument edits need glm-migrate; the mock cannot apply them)"
        return Redirect(rule.match, "not covered", code=rule.code, note=note)
    if mock in (Mock.MODULE, Mock.SYMBOL):
        return Redirect(rule.match, mock.value, rule.target, rule.code, rule.note)
    return Redirect(rule.match, "not covered", code=rule.code, note=rule.note)


@lru_cache(maxsize=None)
def load_plan() -> Plan:
    redirects = {r.match: _redirect(r) for r in _TABLES.rules if scope_of(r.match) and r.spec.mock is not Mock.IGNORED}
    for defined in _TABLES.mock_defined:
        redirects[defined.match] = Redirect(defined.match, "symbol", defined.target, note=defined.note)
    return Plan(list(redirects.values()))


def resolve(dotted: str):
    """The object a dotted target names: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        module = ".".join(parts[:i])
        try:
            obj = importlib.import_module(module)
        except ModuleNotFoundError as exc:
            if exc.name != module:  # a real failure inside the module, not "no such module"
                raise
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ModuleNotFoundError(f"glm-mock: cannot import any module of {dotted!r}")
