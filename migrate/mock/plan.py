"""What glm-mock redirects, read from the rule tables (one mapping, two consumers).

The codemod rewrites ``apex.optimizers.FusedAdam`` to ``shim.optim.FusedAdam``; the
mock serves the same rule at import time. Only rules inside its scopes (:func:`scopes`) matter
here: the rest of torch (``torch.cuda``, ``.cuda()``...) is made portable by
``shim.compat.install()``, not by stand-in modules. The scopes, and the few names served
that no rule maps, are tables in ``rules/`` too (``[[mock_scope]]``, ``[[mock_defined]]``);
what each rule kind means to the mock is its ``mock`` entry in ``migrate.kinds``.
"""

from __future__ import annotations

import importlib
from functools import lru_cache
from typing import NamedTuple

from migrate.rulefiles import parsed_files


@lru_cache(maxsize=None)
def scopes() -> dict[str, str]:
    """Module trees the mock can stand in for -> what to install to get the real thing (``[[mock_scope]]``).

    Read from the parsed TOML alone, on the first import the finder cannot rule out by itself (it
    never asks for a standard-library name, and everything reading the files imports is one): a
    process that imports nothing else pays nothing. ``migrate.rules`` checks every entry when the
    plan is built (:func:`load_plan`), on the first import of a mocked name."""
    return {scope["name"]: scope["install"] for _, data in parsed_files() for scope in data.get("mock_scope", ())}


def mock_defined() -> dict[str, str]:
    """Names the mock serves that no rule can -> what serves them (``[[mock_defined]]``)."""
    return {entry["match"]: entry["target"] for _, data in parsed_files() for entry in data.get("mock_defined", ())}


def __getattr__(name: str):  # SCOPES and MOCK_DEFINED, read when first asked for
    if name == "SCOPES":
        return scopes()
    if name == "MOCK_DEFINED":
        return mock_defined()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Redirect(NamedTuple):
    """One name under a scope: what backs it, or why nothing does."""

    name: str
    kind: str  # "module" (a stand-in forwarding to target), "symbol", or "not covered"
    target: str | None = None
    code: str = ""  # the rule code, "" for a mock_defined name
    note: str = ""


def scope_of(name: str) -> str | None:
    """The scope ``name`` lies in (``"apex"`` for ``apex.amp``), or None."""
    for scope in scopes():
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
            f"(install {scopes()[scope_of(name)]} to use it)"
        )


def _redirect(rule) -> Redirect:
    """What the mock does for ``rule``: its kind's ``mock`` entry in ``migrate.kinds.KINDS``."""
    from migrate.kinds import Mock

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
    from migrate.kinds import Mock
    from migrate.rules import load_tables  # only when a mocked name is imported: start-up stays cheap

    tables = load_tables()
    redirects = {r.match: _redirect(r) for r in tables.rules if scope_of(r.match) and r.spec.mock is not Mock.IGNORED}
    for defined in tables.mock_defined:
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
