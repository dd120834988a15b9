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
