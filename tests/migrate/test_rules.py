"""The rule tables: well formed, every target real, docs/rules.md generated from them."""

from __future__ import annotations

import importlib

import pytest

from migrate import docs
from migrate.kinds import KINDS, Kind, Mock, Site
from migrate.rules import Rule, RuleError, RuleSet, load_rules, load_tables, mapped_name

RULES = load_rules()


def _resolves(name: str) -> bool:
    """``name`` imports, or is an attribute path under the longest prefix that does
    (``shim.nn.Module.state_dict``: a method rule's target)."""
    module, attributes = name, []
    while True:
        try:
            found = importlib.import_module(module)
            break
        except ImportError:
            module, _, attribute = module.rpartition(".")
            attributes.insert(0, attribute)
            if not module:
                return False
    for attribute in attributes:
        if not hasattr(found, attribute):
            return False
        found = getattr(found, attribute)
    return True


@pytest.mark.parametrize("rule", [r for r in RULES if r.target], ids=lambda r: r.code)
def test_target_exists(rule: Rule):
    """Every target resolves: ``shim.*`` in shim, anything else (numpy, builtins) by import; a ``call``
    rule that only edits the arguments of a function of the migrated tree keeps it as its target."""
    if rule.kind == "call" and rule.target == rule.match:
        assert rule.args.get("add") or rule.args.get("drop") or rule.args.get("rename"), rule.code
        return
    assert _resolves(rule.target), f"{rule.code}: {rule.target} does not resolve"


def test_every_rule_is_documented_and_explained():
    assert all(r.note for r in RULES)
    assert len({r.code for r in RULES}) == len(RULES)


def test_docs_are_generated_from_the_tables():
    assert docs.docs_path().read_text(encoding="utf-8") == docs.render(RULES), \
        "docs/rules.md is out of date: run python -m migrate.docs"


def test_mock_facing_entries():
    """glm-mock redirects these imports: module/symbol rules keyed by the fully-qualified source name."""
    by_match = {r.match: r for r in RULES}
    assert by_match["torch._six"].target == "shim.compat.six"
    assert by_match["deepspeed.checkpointing"].kind == "module"
    assert by_match["apex.optimizers.FusedAdam"].target == "shim.optim.FusedAdam"
    assert by_match["apex.normalization.fused_layer_norm.FusedLayerNorm"].target == "shim.nn.FusedLayerNorm"
    assert by_match["apex.amp"].kind == "unsupported"


def test_most_specific_rule_wins():
    rules = RuleSet(RULES)
    assert rules.best("torch.cuda.memory_cached").code == "CUD002"
    assert rules.best("torch.cuda.synchronize").code == "CUD001"
    assert rules.best("torch.zeros").code == "TRC001"
    assert rules.best("apex.amp.scale_loss").code == "APX101"
    assert rules.best("apex.contrib.xentropy").code == "APX199"
    assert rules.best("numpy.zeros") is None


def test_select_and_ignore_take_codes_and_families():
    assert {r.family for r in RuleSet(RULES, select={"APX"}).rules} == {"APX"}
    assert "TRC001" not in {r.code for r in RuleSet(RULES, ignore={"TRC001"}).rules}
    with pytest.raises(RuleError, match="unknown rule code or family: NOPE"):
        RuleSet(RULES, select={"NOPE"})


@pytest.mark.parametrize("table, message", [
    ('[[rule]]\ncode = "X1"\nkind = "symbol"\nmatch = "a.b"\n', "needs a target"),
    ('[[rule]]\ncode = "X1"\nkind = "rename"\nmatch = "a.b"\n', "kind must be one of"),
    ('[[rule]]\ncode = "X1"\nkind = "module"\nmatch = "a"\ntarget = "b"\nwhen = "x"\n', "unknown keys"),
    ('[[rule]]\ncode = "X1"\nkind = "module"\nmatch = "a"\ntarget = "b"\n' * 2, "duplicate rule code X1"),
])
def test_malformed_tables_are_named(tmp_path, table, message):
    (tmp_path / "bad.toml").write_text(table)
    with pytest.raises(RuleError, match=message):
        load_rules(str(tmp_path))


# -- the kind table and the tables beside the rules ----------------------------------------------

TABLES = load_tables()


def test_every_kind_has_one_table_entry_that_its_rules_honour():
    assert set(KINDS) == set(Kind)
    for rule in RULES:
        assert isinstance(rule.kind, Kind) and rule.spec is KINDS[rule.kind]
        assert bool(rule.target) or not rule.spec.needs_target, rule.code
        assert (mapped_name(rule, rule.match) is None) == bool(rule.spec.reported), rule.code
    index = RuleSet(RULES)
    for kind in Kind:  # each rule is indexed where its kind's site says the codemod looks
        for rule in (r for r in RULES if r.kind is kind):
            if KINDS[kind].site is Site.NAME:
                assert index.best(rule.match) is rule
            else:
                assert index.by_kind[kind][rule.match] is rule and kind in index.kinds_at(KINDS[kind].site)


def test_the_docs_column_comes_from_the_kind_table():
    assert all(f"| {r.code} | {r.spec.text} |" in docs.render(RULES) for r in RULES)


def test_mock_scopes_cover_every_name_the_mock_serves():
    scopes = [s.name for s in TABLES.mock_scopes]
    assert scopes == ["apex", "amp_C", "fused_layer_norm_cuda", "deepspeed", "scaled_masked_softmax_cuda",
                      "scaled_upper_triang_masked_softmax_cuda", "scaled_softmax_cuda",
                      "fused_mix_prec_layer_norm_cuda", "torch._six"]
    assert all(s.install for s in TABLES.mock_scopes)
    for scope in scopes:  # a scope no rule covers would only stand in for nothing
        assert any(r.match == scope or r.match.startswith(scope + ".") for r in RULES), scope
    for defined in TABLES.mock_defined:
        assert any(defined.match == s or defined.match.startswith(s + ".") for s in scopes)
        assert defined.note and _resolves(defined.target), defined.match
        ruled = [r for r in RULES if r.match == defined.match]  # only where the rule's own kind cannot serve it
        assert all(r.spec.mock is Mock.NOT_COVERED or (r.spec.mock is Mock.SYMBOL_IF_PLAIN and r.args) for r in ruled)


def test_forbid_entries_are_what_a_migrated_tree_must_not_hold():
    assert {(f.what, f.name, f.outside) for f in TABLES.forbid} == {
        ("import", "apex", None), ("call", "vocab_parallel_cross_entropy", "mpu")}
    for forbid in TABLES.forbid:  # a rule moves each away: the check is of the codemod's own work
        moved = [r for r in RULES if r.match.split(".")[0] == forbid.name or r.match.endswith("." + forbid.name)]
        assert moved and all(r.target or r.kind is Kind.UNSUPPORTED for r in moved), forbid.name


@pytest.mark.parametrize("table, message", [
    ('[[rules]]\ncode = "X1"\n', r"unknown tables \['rules'\]"),
    ('[[mock_scope]]\nname = "apex"\n', r"mock_scope #1: missing \['install'\]"),
    ('[[mock_scope]]\nname = "apex"\ninstall = "x"\nwhy = "y"\n', "unknown keys"),
    ('[[mock_scope]]\nname = "apex"\ninstall = 3\n', "install must be text"),
    ('[[mock_scope]]\nname = "apex"\ninstall = "x"\n' * 2, "duplicate mock_scope apex"),
    ('[[mock_defined]]\nmatch = "ds.f"\ntarget = "shim.f"\nnote = "n"\n', r"mock_defined \(ds.f\): not inside any"),
    ('[[forbid]]\nwhat = "attribute"\nname = "x"\nmessage = "m"\n', "what must be one of"),
    ('[[forbid]]\nwhat = "call"\nname = "x"\n', r"missing \['message'\]"),
    ('rule = 3\n', "rule must be a list of tables"),
    ('[[rule]]\ncode = "X1"\nkind = "call"\nmatch = "a.b"\ntarget = "c"\nargs = "x"\n', "args must be a table"),
    ('[[rule]]\ncode = "X1"\nkind = "call"\nmatch = "a.b"\ntarget = "c"\nargs = { receiver = "argument" }\n',
     r"args \['receiver'\] not known for kind 'call'"),
    ('[[rule]]\ncode = "X1"\nkind = "call"\nmatch = "a.b"\ntarget = "c"\nargs = { scope = "package" }\n',
     r"args.scope must be one of \['module'\]"),
    ('[[rule]]\ncode = "X1"\nkind = "method"\nmatch = "m"\ntarget = "c"\nargs = { receiver = "self" }\n',
     r"args.receiver must be one of \['argument'\]"),
])
def test_malformed_side_tables_are_named(tmp_path, table, message):
    (tmp_path / "bad.toml").write_text(table)
    with pytest.raises(RuleError, match=message):
        load_tables(str(tmp_path))
