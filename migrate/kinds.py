"""Rule kinds, one table: what each kind needs, where the codemod looks for it, what glm-mock does.

Every consumer asks this table instead of testing kind strings: the loader (``needs_target``),
the rule index (``site``), the codemod (its planners are picked by ``site``; ``reported`` kinds are
listed, never rewritten), glm-mock (``mock``) and ``docs/rules.md`` (``text``). Adding a kind is
one entry here and, if it rewrites something new, one planner in ``migrate.codemod``
(``calls.CallRewrites.planners`` for a call site).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Kind(str, Enum):
    """A rule's kind, as spelled in ``rules/*.toml`` (a ``str``: ``Kind.CALL == "call"``)."""

    MODULE = "module"
    SYMBOL = "symbol"
    CALL = "call"
    ARGUMENT = "argument"
    METHOD = "method"
    UNSUPPORTED = "unsupported"
    REPORT = "report"

    def __str__(self) -> str:
        return self.value

    @property
    def spec(self) -> "KindSpec":
        return KINDS[self]


class Site(str, Enum):
    """Where the codemod matches a rule of a kind."""

    NAME = "name"  # any dotted name resolved to ``match`` or under it (imports, references); most specific wins
    CALLEE = "callee"  # a call whose callee resolves to ``match`` exactly
    METHOD = "method"  # a call ``x.<match>(...)`` on any receiver


class Mock(str, Enum):
    """What glm-mock serves for a rule's ``match`` (rules outside the mock's scopes are ignored)."""

    MODULE = "module"  # a stand-in module forwarding to ``target``
    SYMBOL = "symbol"  # ``target``'s object under the old name
    SYMBOL_IF_PLAIN = "symbol if plain"  # as SYMBOL when the rule has no ``args``; else not covered
    NOT_COVERED = "not covered"  # importing it raises, naming the rule and its note
    IGNORED = "ignored"  # not a name the mock can see (a method)


@dataclass(frozen=True)
class KindSpec:
    needs_target: bool
    site: Site
    mock: Mock
    reported: str | None  # None: rewritten; else the report list it goes to ("unconverted", "kept")
    text: str  # its column in docs/rules.md
    args: frozenset[str] = frozenset()  # the ``args`` keys a rule of this kind may set (rules/README.md)


# ``args`` keys whose value is one word out of a few: key -> the words it may be
ARG_CHOICES: dict[str, frozenset[str]] = {
    "scope": frozenset({"module"}),  # call rule on the tree's own function: only its defining module keeps it
    "receiver": frozenset({"argument"}),  # method rule: x.m(...) becomes target(x, ...)
}


KINDS: dict[Kind, KindSpec] = {
    Kind.MODULE: KindSpec(True, Site.NAME, Mock.MODULE, None, "module"),
    Kind.SYMBOL: KindSpec(True, Site.NAME, Mock.SYMBOL, None, "symbol"),
    Kind.CALL: KindSpec(True, Site.CALLEE, Mock.SYMBOL_IF_PLAIN, None, "call (arguments edited)",
                        frozenset({"signature", "rename", "drop", "keywords", "strip_methods", "add", "scope"})),
    Kind.ARGUMENT: KindSpec(True, Site.CALLEE, Mock.NOT_COVERED, None, "argument value",
                            frozenset({"keyword", "assigned"})),
    Kind.METHOD: KindSpec(True, Site.METHOD, Mock.IGNORED, None, "method call",
                          frozenset({"signature", "rename", "drop", "keywords", "method", "receiver"})),
    Kind.UNSUPPORTED: KindSpec(False, Site.NAME, Mock.NOT_COVERED, "unconverted", "unsupported (reported)"),
    Kind.REPORT: KindSpec(False, Site.NAME, Mock.NOT_COVERED, "kept", "kept (reported)"),
}
assert set(KINDS) == set(Kind), "every Kind needs its KINDS entry"
