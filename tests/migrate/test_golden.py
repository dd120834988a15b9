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
    assert [(u["line"], u["code"]) for u in report.unconverted] == [(4, "APX101"), (21, "APX101")]
    assert all(u["reason"] for u in report.unconverted)


def test_apex_pieces_without_equivalent_are_reported_with_reasons(migrate):
    source = (GOLDEN / "apex_more.in.py").read_text(encoding="utf-8")
    _, report = migrate(source, "apex_more.py")
    assert [(u["line"], u["code"]) for u in report.unconverted] == [
        (16, "APX108"), (17, "APX105"), (17, "APX106"), (20, "APX107"),
        *[(line, "APX199") for line in range(21, 26)],  # `import apex...` stays: apex.parallel.SyncBatchNorm needs it
        (35, "APX109"), (36, "APX110"), (37, "APX111"), (38, "APX108"), (66, "APX199"),
        (68, "APX105"), (68, "APX106"), (68, "APX107"),
    ]
    assert {c["code"] for c in report.changes} >= {"APX010", "APX011", "APX012", "APX034", "APX036"}


def test_megatron_start_up_and_kernels(migrate):
    """Kernel imports (also through importlib), fused_kernels.load, initialize_megatron, .type(),
    and cpp_extension kept and listed with the file's line."""
    source = (GOLDEN / "megatron_kernels.in.py").read_text(encoding="utf-8")
    migrated, report = migrate(source, "megatron_kernels.py")
    assert [(k["line"], k["code"]) for k in report.kept] == [(5, "TRC101"), (35, "TRC101")]
    assert report.unconverted == [] and report.error is None
    codes = {c["code"] for c in report.changes}
    assert codes >= {"MEG001", "MEG002", "MEG003", "MEG004", "MEG005", "MEG006", "CUD006", "CUD007"}
    assert '"shim.kernels.fused_mix_prec_layer_norm_cuda"' in migrated
    assert "tensor_type(param, torch.cuda.HalfTensor)" in migrated and "= param.dtype.type  #" in migrated


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
