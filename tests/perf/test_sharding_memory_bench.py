"""bench.sharding_memory's memory guard: the per-rank estimate counts 1/N of the fp32 state and, sharded, the
root and one layer held whole; a world size that would not fit the machine is skipped in one line."""

import argparse

from bench import sharding_memory
from bench.sharding_memory import MIB, estimated_rank_bytes


def _args(**overrides):
    values = dict(hidden=64, heads=4, ffn=256, layers=2, vocab=512, seq=16)
    return argparse.Namespace(**{**values, **overrides})


def test_the_estimate_is_a_nth_of_the_state_plus_what_a_sharded_rank_gathers():
    args = _args()
    layer = 4 * 64 * 64 + 4 * 64 + 2 * 64 * 256 + 256 + 64 + 4 * 64  # qkv, dense, mlp, two layer norms
    whole, largest, root = sharding_memory._block_sizes(args)
    assert largest == layer and whole == root + 2 * layer and root >= 512 * 64
    assert estimated_rank_bytes(args, 1, import_bytes=0) == int(1.2 * 16 * whole)
    assert estimated_rank_bytes(args, 4, import_bytes=0) == int(1.2 * (16 * whole // 4 + 8 * (layer + root)))


def test_a_world_size_that_would_not_fit_is_skipped_in_one_line(monkeypatch, capsys):
    monkeypatch.setattr(sharding_memory, "available_bytes", lambda: 64 * MIB)
    ran = []
    monkeypatch.setattr(sharding_memory, "measure", lambda args, world: ran.append(world) or [])
    sharding_memory.main(["--hidden", "64", "--heads", "4", "--ffn", "256", "--vocab", "512", "--ranks", "1", "4"])
    out = capsys.readouterr().out
    assert ran == [] and "4 ranks: skipped: they would need about" in out and "(fewer --layers" in out
    sharding_memory.main(["--hidden", "64", "--heads", "4", "--ffn", "256", "--vocab", "512", "--ranks", "4",
                          "--force"])
    assert ran == [4]


def test_load_mode_runs_glm_finetunes_load_on_one_and_two_ranks(capsys):
    """--load: a small ChatGLM2 checkpoint written, then glm-finetune's setup on 1 and 2 ranks (sharded): a row
    per rank and the summary line."""
    sharding_memory.main(["--load", "--hidden", "64", "--heads", "4", "--ffn", "128", "--vocab", "512", "--layers",
                          "2", "--seq", "32", "--ranks", "1", "2"])
    out = capsys.readouterr().out
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| 1 |") or line.startswith("| 2 |")]
    assert [(r[0].strip(), r[1].strip()) for r in rows] == [("1", "0"), ("2", "0"), ("2", "1")]
    assert "2 ranks: load's peak RSS rise: rank 0" in out


def test_load_mode_skips_a_world_size_that_would_not_fit(monkeypatch, capsys):
    monkeypatch.setattr(sharding_memory, "available_bytes", lambda: 64 * MIB)
    sharding_memory.main(["--load", "--layers", "1", "--vocab", "8192", "--ranks", "1", "4"])
    assert "the checkpoint: skipped: writing it would need about" in capsys.readouterr().out
