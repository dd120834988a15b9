"""The rule tables in ``rules/*.toml``: loading and validation.

One set of tables feeds three consumers: the static codemod (``glm-migrate``), the
runtime import redirection (``glm-mock``) and the upstream harness's checks of a
migrated tree. Each file may hold four kinds of table (``rules/README.md``):

- ``[[rule]]``: one mapping (:class:`Rule`; its ``kind`` is a :class:`migrate.kinds.Kind`);
- ``[[mock_scope]]``: a package tree glm-mock may stand in for, and what installs the real one;
- ``[[mock_defined]]``: a name glm-mock serves that no rule maps (the codemod rewrites its call);
- ``[[forbid]]``: what must not be left in a migrated tree (``glm-migrate --verify``'s static check).

Everything is validated on load; a malformed entry is a :class:`RuleError` naming file and entry.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from migrate.kinds import ARG_CHOICES, KINDS, Kind, KindSpec, Site
from migrate.rulefiles import RuleError, parsed_files, rules_dir

__all__ = ["Forbid", "MockDefined", "MockScope", "Rule", "RuleError", "RuleSet", "Tables", "load_rules",
           "load_tables", "mapped_name", "rules_dir"]  # fmt: skip

SAFETY = frozenset({"safe", "review"})
NEEDS_TARGET = frozenset(kind.value for kind, spec in KINDS.items() if spec.needs_target)
FORBID_WHAT = frozenset({"import", "call"})


@dataclass(frozen=True)
class Rule:
    code: str
    kind: Kind
    match: str
    target: str | None = None
    safety: str = "safe"
    note: str = ""
    args: dict = field(default_factory=dict)
    source: str = ""

    def __post_init__(self):
        object.__setattr__(self, "kind", Kind(self.kind))  # "call" in a table, Kind.CALL here

    @property
    def family(self) -> str:
        """The letter prefix of the code (APX, DSP, DST...), used by --select/--ignore."""
        return self.code.rstrip("0123456789")

    @property
    def spec(self) -> KindSpec:
        """What its kind means to every consumer (``migrate.kinds.KINDS``)."""
        return KINDS[self.kind]


@dataclass(frozen=True)
class MockScope:
    """A package tree glm-mock may stand in for (``apex``), and what to install to get the real one."""

    name: str
    install: str
    source: str = ""


@dataclass(frozen=True)
class MockDefined:
    """A name glm-mock serves from ``target`` although no rule maps it (the codemod edits its call)."""

    match: str
    target: str
    note: str
    source: str = ""


@dataclass(frozen=True)
class Forbid:
    """What a migrated tree must not contain: an ``import`` of the package ``name`` (or under it), or a
    ``call`` of a function or method named ``name`` (anywhere but under the top-level folder ``outside``)."""

    what: str
    name: str
    message: str
    outside: str | None = None
    source: str = ""


@dataclass(frozen=True)
class Tables:
    """Every table of a rules directory."""

    rules: tuple[Rule, ...]
    mock_scopes: tuple[MockScope, ...]
    mock_defined: tuple[MockDefined, ...]
    forbid: tuple[Forbid, ...]


_ENTRY_TYPES = {"rule": Rule, "mock_scope": MockScope, "mock_defined": MockDefined, "forbid": Forbid}
_REQUIRED = {"rule": {"code", "kind", "match"}, "mock_scope": {"name", "install"},
             "mock_defined": {"match", "target", "note"}, "forbid": {"what", "name", "message"}}  # fmt: skip


def _entries(path: Path, data: dict, table: str) -> list[tuple[str, dict]]:
    """``(where, entry)`` for each entry of ``[[table]]``, its keys checked against its dataclass."""
    entries = data.get(table, [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise RuleError(f"{path.name}: {table} must be a list of tables ([[{table}]])")
    fields = {f for f in _ENTRY_TYPES[table].__dataclass_fields__ if f != "source"}
    checked = []
    for i, entry in enumerate(entries):
        where = f"{path.name} {table} #{i + 1}"
        missing = _REQUIRED[table] - entry.keys()
        if missing:
            raise RuleError(f"{where}: missing {sorted(missing)}")
        label = f"{where} ({entry.get('code') or entry.get('name') or entry.get('match')})"
        unknown = entry.keys() - fields
        if unknown:
            raise RuleError(f"{label}: unknown keys {sorted(unknown)}")
        not_text = sorted(k for k, v in entry.items() if k != "args" and not isinstance(v, str))
        if not_text:
            raise RuleError(f"{label}: {', '.join(not_text)} must be text")
        checked.append((label, entry))
    return checked


def _parse(path: Path, data: dict) -> Tables:
    unknown = data.keys() - _ENTRY_TYPES.keys()
    if unknown:
        raise RuleError(f"{path.name}: unknown tables {sorted(unknown)} (known: {sorted(_ENTRY_TYPES)})")
    rules = []
    for where, entry in _entries(path, data, "rule"):
        if entry["kind"] not in {k.value for k in Kind}:
            raise RuleError(f"{where}: kind must be one of {sorted(k.value for k in Kind)}")
        if entry["kind"] in NEEDS_TARGET and not entry.get("target"):
            raise RuleError(f"{where}: kind {entry['kind']!r} needs a target")
        if entry.get("safety", "safe") not in SAFETY:
            raise RuleError(f"{where}: safety must be one of {sorted(SAFETY)}")
        args = entry.get("args", {})
        if not isinstance(args, dict):
            raise RuleError(f"{where}: args must be a table")
        allowed = KINDS[Kind(entry["kind"])].args
        if args.keys() - allowed:
            raise RuleError(f"{where}: args {sorted(args.keys() - allowed)} not known for kind {entry['kind']!r}"
                            f" (known: {sorted(allowed)})")  # fmt: skip
        for key, words in ARG_CHOICES.items():
            if key in args and args[key] not in words:
                raise RuleError(f"{where}: args.{key} must be one of {sorted(words)}")
        rules.append(Rule(**entry, source=path.name))
    forbid = []
    for where, entry in _entries(path, data, "forbid"):
        if entry["what"] not in FORBID_WHAT:
            raise RuleError(f"{where}: what must be one of {sorted(FORBID_WHAT)}")
        forbid.append(Forbid(**entry, source=path.name))
    return Tables(
        tuple(rules),
        tuple(MockScope(**e, source=path.name) for _, e in _entries(path, data, "mock_scope")),
        tuple(MockDefined(**e, source=path.name) for _, e in _entries(path, data, "mock_defined")),
        tuple(forbid),
    )


@lru_cache(maxsize=None)
def load_tables(directory: str | None = None) -> Tables:
    """Every table from every ``*.toml`` in ``directory`` (default: :func:`rules_dir`), checked across
    files: rule codes and mock scopes unique, each ``mock_defined`` name inside a mock scope."""
    parts = [_parse(path, data) for path, data in parsed_files(directory)]
    tables = Tables(*(tuple(x for part in parts for x in getattr(part, f)) for f in Tables.__dataclass_fields__))
    seen: dict[str, str] = {}
    for rule in tables.rules:
        if rule.code in seen:
            raise RuleError(f"duplicate rule code {rule.code} in {rule.source} and {seen[rule.code]}")
        seen[rule.code] = rule.source
    scopes: dict[str, str] = {}
    for scope in tables.mock_scopes:
        if scope.name in scopes:
            raise RuleError(f"duplicate mock_scope {scope.name} in {scope.source} and {scopes[scope.name]}")
        scopes[scope.name] = scope.source
    for defined in tables.mock_defined:
        if not any(defined.match == s or defined.match.startswith(s + ".") for s in scopes):
            raise RuleError(f"{defined.source} mock_defined ({defined.match}): not inside any mock_scope "
                            f"({', '.join(scopes)})")  # fmt: skip
    return tables


def load_rules(directory: str | None = None) -> tuple[Rule, ...]:
    """All rules from every ``*.toml`` in ``directory`` (default: :func:`rules_dir`), codes unique; none at
    all is an error (a migration by an empty rule set would report every file as done)."""
    rules = load_tables(directory).rules
    if not rules:
        files = parsed_files(directory)
        where = directory or rules_dir()
        raise RuleError(f"no rules in {where}: " + (f"its {len(files)} *.toml file(s) define no [[rule]]" if files
                                                     else "no *.toml rule tables there"))
    return rules


class RuleSet:
    """The active rules, indexed for lookup by fully-qualified name.

    ``select`` / ``ignore`` take rule codes (``APX001``) or families (``APX``).
    """

    def __init__(self, rules: tuple[Rule, ...], select: set[str] | None = None, ignore: set[str] = frozenset()):
        known = {r.code for r in rules} | {r.family for r in rules}
        unknown = sorted((set(select or ()) | set(ignore)) - known)
        if unknown:
            raise RuleError(f"unknown rule code or family: {', '.join(unknown)}")

        def active(rule: Rule) -> bool:
            wanted = select is None or rule.code in select or rule.family in select
            return wanted and rule.code not in ignore and rule.family not in ignore

        self.rules = tuple(r for r in rules if active(r))
        self._by_name = {r.match: r for r in self.rules if r.spec.site is Site.NAME}
        # kind -> {match: rule}: how the codemod finds the rules matched at a call site
        self.by_kind: dict[Kind, dict[str, Rule]] = {kind: {} for kind in Kind}
        for rule in self.rules:
            self.by_kind[rule.kind][rule.match] = rule
        self.calls = self.by_kind[Kind.CALL]
        self.arguments = self.by_kind[Kind.ARGUMENT]
        self.methods = self.by_kind[Kind.METHOD]

    @staticmethod
    def kinds_at(site: Site) -> list[Kind]:
        """The kinds matched at ``site``, in the order the codemod tries them (the table's)."""
        return [kind for kind, spec in KINDS.items() if spec.site is site]

    def best(self, name: str) -> Rule | None:
        """The most specific module/symbol/unsupported/report rule covering ``name`` (itself or a parent)."""
        while name:
            rule = self._by_name.get(name)
            if rule is not None:
                return rule
            name = name.rpartition(".")[0]
        return None

    def trigger_words(self) -> frozenset[str]:
        """Words a file must contain for any rule to apply to it (checked before parsing)."""
        words = {r.match for r in self.rules if r.spec.site is Site.METHOD}
        for rule in self.rules:
            if rule.spec.site is not Site.METHOD:
                # an external name is reached through an import of its root module
                words.add(rule.match.split(".")[0])
            if rule.kind is Kind.CALL:
                # a call into the tree may be reached through a re-export under its own name
                words.add(rule.match.rpartition(".")[2])
        return frozenset(words)

    def reexport_words(self) -> frozenset[str]:
        """Names whose re-exports matter: only ``call`` rules (and their templates) match inside a tree."""
        names = [r.match for r in self.calls.values()] + [n for r in self.calls.values() for n in _template_names(r)]
        return frozenset(name.rpartition(".")[2] for name in names)


def _template_names(rule: Rule) -> list[str]:
    return [name for text in rule.args.get("add", {}).values() for name in re.findall(r"\{([\w.]+)\}", text)]


def mapped_name(rule: Rule, name: str) -> str | None:
    """What ``name`` (covered by ``rule``) becomes, or None for unsupported/report rules."""
    if rule.target is None or rule.spec.reported:
        return None
    return rule.target + name[len(rule.match):]
