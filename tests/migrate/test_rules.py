"""The rule tables: well formed, every target real, docs/rules.md generated from them."""

from __future__ import annotations

import importlib

import pytest

from migrate import docs
from migrate.rules import Rule, RuleError, RuleSet, load_rules

RULES = load_rules()


def _resolves(name: str) -> bool:
    try:
        importlib.import_module(name)
        return True
    except ImportError:
        module, _, attribute = name.rpartition(".")
        return hasattr(importlib.import_module(module), attribute)


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
