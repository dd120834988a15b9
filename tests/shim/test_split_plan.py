"""shim.nn.split_plan: one ``Split`` says how a tensor is cut over tensor-parallel ranks; ``slice_for_rank``
and ``merge_ranks`` are exact inverses, lazily on safetensors slices too; a plan is an ordered table."""

import pytest
import torch

from shim.nn.split_plan import REPLICATED, Split, SplitPlan, merge_ranks, slice_for_rank
from shim.nn.tensor_parallel import Linear1D, section_part, sections_whole

SPLITS = [
    (Split(0), 8, 4),
    (Split(1), 8, 4),
    (Split(0, stride=3), 24, 4),
    (Split(1, stride=2), 8, 4),
    (Split(0, sections=(8, 4, 4)), 16, 4),
    (Split(0, sections=(8, 2, 2), section_replicas=(1, 2, 2)), 12, 4),  # 2 groups on 4 ranks
    (Split(0, sections=(4, 1, 1), section_replicas=(1, 4, 4)), 6, 4),  # 1 group on 4 ranks
]


@pytest.mark.parametrize("split, length, size", SPLITS)
def test_slicing_every_rank_then_merging_gives_the_whole_back(split, length, size):
    shape = [length, 6] if split.dim == 0 else [5, length]
    whole = torch.randn(shape)
    parts = [slice_for_rank(whole, split, rank, size) for rank in range(size)]
    assert torch.equal(merge_ranks(parts, split), whole)
    if split.section_replicas is None:  # every element held by exactly one rank
        assert sum(p.numel() for p in parts) == whole.numel()


def test_by_hand():
    rows = torch.arange(12).view(12, 1)
    # stride 3 on 2 ranks: rank 1 holds the second half of each third
    assert slice_for_rank(rows, Split(0, stride=3), 1, 2).flatten().tolist() == [2, 3, 6, 7, 10, 11]
    # Q (4 rows) | K (4) | V (4), K and V held by 2 ranks each at size 4: rank 3 holds q3, k1, v1
    qkv = Split(0, sections=(4, 4, 4), section_replicas=(1, 2, 2))
    assert slice_for_rank(rows, qkv, 3, 4).flatten().tolist() == [3, 6, 7, 10, 11]
    cols = torch.arange(8).view(1, 8)
    assert slice_for_rank(cols, Split(1), 1, 4).tolist() == [[2, 3]]


def test_a_one_block_cut_is_a_view_and_a_replicated_tensor_is_itself():
    whole = torch.randn(8, 4)
    assert slice_for_rank(whole, Split(0), 1, 2).data_ptr() == whole[4].data_ptr()
    assert slice_for_rank(whole, REPLICATED, 1, 2) is whole
    assert slice_for_rank(whole, Split(0, stride=2), 0, 1) is whole
    assert merge_ranks([whole, whole.clone()], REPLICATED) is whole


def test_lazy_safetensors_slices_read_the_same_parts(tmp_path):
    from safetensors import safe_open
    from safetensors.torch import save_file

    whole = torch.randn(12, 8)
    save_file({"w": whole}, str(tmp_path / "w.safetensors"))
    with safe_open(str(tmp_path / "w.safetensors"), "pt") as handle:
        lazy = handle.get_slice("w")
        for split in (Split(0), Split(1), Split(0, stride=3), Split(0, sections=(4, 4, 4), section_replicas=(1, 2, 2))):
            for rank in range(2):
                assert torch.equal(slice_for_rank(lazy, split, rank, 2), slice_for_rank(whole, split, rank, 2))


def test_cuts_that_do_not_divide_are_value_errors():
    with pytest.raises(ValueError, match="does not split into 3 parts"):
        slice_for_rank(torch.zeros(8, 2), Split(0), 0, 3)
    with pytest.raises(ValueError, match="stride 3"):
        slice_for_rank(torch.zeros(8, 2), Split(0, stride=3), 0, 2)
    with pytest.raises(ValueError, match="do not add up"):
        slice_for_rank(torch.zeros(8, 2), Split(0, sections=(4, 2)), 0, 2)
    with pytest.raises(ValueError, match="not a multiple"):
        slice_for_rank(torch.zeros(8, 2), Split(0, sections=(4, 4), section_replicas=(1, 3)), 0, 4)
    with pytest.raises(ValueError):
        Split(2)
    with pytest.raises(ValueError):
        Split(0, stride=2, sections=(2, 2))
    with pytest.raises(ValueError):
        Split(None, stride=2)


def test_no_replication_has_one_spelling():
    assert Split(0, sections=[4, 2, 2], section_replicas=(1, 1, 1)) == Split(0, sections=(4, 2, 2))


def test_a_plan_takes_the_first_rule_found_in_a_name():
    plan = SplitPlan.of(((r"\.qkv\.", Split(0, stride=3)), (r"\.dense\.weight$", Split(1)), (r"qkv", Split(1))))
    assert plan.split_for("layers.0.qkv.weight") == Split(0, stride=3)
    assert plan.split_for("layers.0.dense.weight") == Split(1)
    assert plan.split_for("layers.0.dense.bias") is REPLICATED
    assert plan.layer_kwargs("layers.0.qkv.weight") == {"parallel": "col", "stride": 3}
    whole = torch.randn(6, 2)
    parts = [plan.slice("layers.0.qkv.bias", whole, r, 2) for r in range(2)]
    assert torch.equal(plan.merge("layers.0.qkv.bias", parts), whole)


def test_a_linear_built_from_a_split_holds_it():
    for split in (Split(0, stride=3), Split(1), Split(0, sections=(4, 2, 2)), REPLICATED):
        out = 8 if split.sections else 6
        layer = Linear1D(4, out, **split.layer_kwargs())
        assert Split.of_layer(layer) == split
        assert split.bias == (split if split.dim == 0 else REPLICATED)


def test_section_part_and_sections_whole_are_the_plan_cut():
    whole = torch.randn(12, 3)
    for rank in range(4):
        assert torch.equal(section_part(whole, (4, 4, 4), rank, 4, (1, 2, 2)),
                           torch.cat([whole[rank:rank + 1], whole[4 + 2 * (rank // 2):6 + 2 * (rank // 2)],
                                      whole[8 + 2 * (rank // 2):10 + 2 * (rank // 2)]]))
    parts = [section_part(whole, (4, 4, 4), r, 4, (1, 2, 2)) for r in range(4)]
    assert torch.equal(sections_whole(parts, (4, 4, 4), (1, 2, 2)), whole)
