"""The rule tables in ``rules/*.toml``: loading and validation.

One table feeds two consumers: the static codemod (``glm-migrate``) and the
runtime import redirection (``glm-mock``). See ``rules/README.md`` for the schema.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

KINDS = frozenset({"module", "symbol", "call", "method", "unsupported", "report"})
SAFETY = frozenset({"safe", "review"})


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
        if entry.get("safety", "safe") not in SAFETY:
            raise RuleError(f"{where} ({entry['code']}): safety must be one of {sorted(SAFETY)}")
        rules.append(Rule(**entry, source=path.name))
    return rules


@lru_cache(maxsize=None)
def load_rules(directory: str | None = None) -> tuple[Rule, ...]:
    """All rules from every ``*.toml`` in ``directory`` (default: :func:`rules_dir`), codes unique."""
    root = Path(directory) if directory else rules_dir()
    rules: list[Rule] = []
    for path in sorted(root.glob("*.toml")):
        rules.extend(_parse(path))
    seen: dict[str, str] = {}
    for rule in rules:
        if rule.code in seen:
            raise RuleError(f"duplicate rule code {rule.code} in {rule.source} and {seen[rule.code]}")
        seen[rule.code] = rule.source
    return tuple(rules)
