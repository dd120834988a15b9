"""Golden fixtures: each ``*.in.py`` migrates to its ``*.out.py``, and migrating the output changes nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from migrate.rules import load_rules

GOLDEN = Path(__file__).parent / "fixtures" / "golden"
CASES = sorted(GOLDEN.glob("*.in.py"))


def _expected(case: Path) -> Path:
    return case.with_name(case.name.replace(".in.py", ".out.py"))


def _name(case: Path) -> str:
    return case.name.replace(".in.py", ".py")


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name.removesuffix(".in.py"))
def test_golden(case, migrate):
    migrated, report = migrate(case.read_text(encoding="utf-8"), _name(case))
    assert report.error is None
    assert migrated == _expected(case).read_text(encoding="utf-8")


@pytest.mark.parametrize("case", CASES, ids=lambda p: p.name.removesuffix(".in.py"))
def test_idempotent(case, migrate):
    expected = _expected(case).read_text(encoding="utf-8")
    again, report = migrate(expected, _name(case))
    assert again == expected
    assert report.changes == []


def test_every_rule_has_a_golden_case(migrate):
    """Each rule code shows up (changed, unconverted or kept) in at least one golden fixture."""
    seen = set()
    for case in CASES:
        _, report = migrate(case.read_text(encoding="utf-8"), _name(case))
        seen |= {e["code"] for e in (*report.changes, *report.unconverted, *report.kept)}
    missing = sorted({r.code for r in load_rules()} - seen)
    assert not missing, f"rules without a golden fixture: {missing}"


def test_untouched_file_is_byte_for_byte(migrate):
    source = (GOLDEN / "untouched.in.py").read_text(encoding="utf-8")
    migrated, report = migrate(source, "untouched.py")
    assert migrated == source
    assert report.changes == report.unconverted == report.kept == []


def test_apex_constructs_without_equivalent_are_reported(migrate):
    source = (GOLDEN / "apex_optimizers.in.py").read_text(encoding="utf-8")
    _, report = migrate(source, "apex_optimizers.py")
    assert [(u["line"], u["code"]) for u in report.unconverted] == [
        (4, "APX101"), (5, "APX102"), (6, "APX103"), (21, "APX101"), (22, "APX102"), (22, "APX103"),
    ]
    assert all(u["reason"] for u in report.unconverted)


def test_deepspeed_engine_is_kept_and_listed(migrate):
    source = (GOLDEN / "deepspeed_checkpointing.in.py").read_text(encoding="utf-8")
    _, report = migrate(source, "deepspeed_checkpointing.py")
    assert [(k["line"], k["code"]) for k in report.kept] == [(17, "DSP101")]
    assert report.unconverted == []


def test_fstring_sites_are_reported_not_rewritten(migrate):
    source = (GOLDEN / "scoping.in.py").read_text(encoding="utf-8")
    migrated, report = migrate(source, "scoping.py")
    assert [(u["line"], u["code"]) for u in report.unconverted] == [(29, "CUD002")]
    assert 'f"{torch.cuda.memory_cached()}"' in migrated
