"""The rule tables in ``rules/*.toml``: loading and validation.

One table feeds two consumers: the static codemod (``glm-migrate``) and the
runtime import redirection (``glm-mock``). See ``rules/README.md`` for the schema.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

KINDS = frozenset({"module", "symbol", "call", "argument", "method", "unsupported", "report"})
SAFETY = frozenset({"safe", "review"})
NEEDS_TARGET = frozenset({"module", "symbol", "call", "argument", "method"})


class RuleError(ValueError):
    """A rule table is malformed."""


@dataclass(frozen=True)
class Rule:
    code: str
    kind: str
    match: str
    target: str | None = None
    safety: str = "safe"
    note: str = ""
    args: dict = field(default_factory=dict)
    source: str = ""

    @property
    def family(self) -> str:
        """The letter prefix of the code (APX, DSP, DST...), used by --select/--ignore."""
        return self.code.rstrip("0123456789")


def rules_dir() -> Path:
    """The rules/ directory: beside the packages in a checkout, or under share/ when installed."""
    here = Path(__file__).resolve().parent.parent / "rules"
    if here.is_dir():
        return here
    installed = Path(sys.prefix) / "share" / "glm-migrate" / "rules"
    if installed.is_dir():
        return installed
    raise RuleError(f"rule tables not found (looked in {here} and {installed})")


def _parse(path: Path) -> list[Rule]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise RuleError(f"{path.name}: {exc}") from None
    rules = []
    for i, entry in enumerate(data.get("rule", [])):
        where = f"{path.name} rule #{i + 1}"
        missing = {"code", "kind", "match"} - entry.keys()
        if missing:
            raise RuleError(f"{where}: missing {sorted(missing)}")
        unknown = entry.keys() - {f for f in Rule.__dataclass_fields__ if f != "source"}
        if unknown:
            raise RuleError(f"{where} ({entry['code']}): unknown keys {sorted(unknown)}")
        if entry["kind"] not in KINDS:
            raise RuleError(f"{where} ({entry['code']}): kind must be one of {sorted(KINDS)}")
        if entry["kind"] in NEEDS_TARGET and not entry.get("target"):
            raise RuleError(f"{where} ({entry['code']}): kind {entry['kind']!r} needs a target")
        if entry.get("safety", "safe") not in SAFETY:
            raise RuleError(f"{where} ({entry['code']}): safety must be one of {sorted(SAFETY)}")
        rules.append(Rule(**entry, source=path.name))
    return rules


@lru_cache(maxsize=None)
def load_rules(directory: str | None = None) -> tuple[Rule, ...]:
    """All rules from every ``*.toml`` in ``directory`` (default: :func:`rules_dir`), codes unique."""
    root = Path(directory) if directory else rules_dir()
    if not root.is_dir():
        raise RuleError(f"rule tables not found: {root} is not a directory")
    rules: list[Rule] = []
    for path in sorted(root.glob("*.toml")):
        rules.extend(_parse(path))
    seen: dict[str, str] = {}
    for rule in rules:
        if rule.code in seen:
            raise RuleError(f"duplicate rule code {rule.code} in {rule.source} and {seen[rule.code]}")
        seen[rule.code] = rule.source
    return tuple(rules)


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
        self._by_name = {r.match: r for r in self.rules if r.kind not in ("call", "argument", "method")}
        self.calls = {r.match: r for r in self.rules if r.kind == "call"}
        self.arguments = {r.match: r for r in self.rules if r.kind == "argument"}
        self.methods = {r.match: r for r in self.rules if r.kind == "method"}

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
        words = set(self.methods)
        for rule in self.rules:
            if rule.kind != "method":
                # an external name is reached through an import of its root module
                words.add(rule.match.split(".")[0])
            if rule.kind == "call":
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
    if rule.target is None or rule.kind in ("unsupported", "report"):
        return None
    return rule.target + name[len(rule.match):]
