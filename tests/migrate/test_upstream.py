"""The real THUDM/GLM tree (GLM_UPSTREAM, or ../upstream, when present): migrated whole, nothing left broken."""

from __future__ import annotations

import ast

from migrate.runner import Options, migrate_tree


def test_upstream_migrates_cleanly_and_idempotently(upstream, tmp_path):
    root, results, summary = migrate_tree(Options(src=upstream, jobs=2, quiet=True))
    assert summary["files_scanned"] == 69 and summary["errors"] == 0
    assert summary["unconverted"] == 0
    kept = {(r.report.path, k["code"]) for r in results if r.report for k in r.report.kept}
    assert kept == {("train_utils.py", "DSP101")}  # the DeepSpeed engine, reached only with --deepspeed

    migrated = {r.relpath: r.migrated for r in results if r.migrated is not None}
    for path, data in migrated.items():
        ast.parse(data, filename=str(path))  # every rewritten file still parses
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_bytes(data)
    pretrain = migrated[next(p for p in migrated if p.name == "pretrain_glm.py")].decode()
    assert "torch.nn.functional.sparse_softmax_cross_entropy(logits," in pretrain
    assert "deepspeed.checkpointing" not in pretrain

    _, again, second = migrate_tree(Options(src=tmp_path, jobs=2, quiet=True))
    assert second["files_changed"] == 0 and second["changes"] == 0
