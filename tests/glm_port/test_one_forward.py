"""GLM has one forward: the transformers model (hf.py) runs GLMModel's, so the two cannot drift."""

import pytest
import torch
from transformers.cache_utils import DynamicCache

from glm_port import GLMModel
from glm_port.models.glm.attention import visibility_mask
from glm_port.models.glm.hf import GLMForConditionalGeneration, GLMPretrainedConfig


def tiny(block_position_encoding=True):
    torch.manual_seed(0)
    config = GLMPretrainedConfig(num_layers=2, hidden_size=32, num_attention_heads=4, vocab_size=50,
                                 max_sequence_length=16, initializer_range=0.3,
                                 block_position_encoding=block_position_encoding)
    return GLMForConditionalGeneration(config).eval()


IDS = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(1))
POSITIONS_3D = torch.stack((torch.arange(7).expand(2, 7), torch.tensor([[0] * 4 + [1, 2, 3]] * 2)), dim=1)
SEP = torch.tensor([4, 3])


@pytest.mark.parametrize("block, positions", [(True, "3d"), (False, "3d"), (False, "2d")])
def test_hf_forward_equals_glm_model_forward(block, positions):
    """2D (block) positions take ``[b, 2, s]``; without them ``[b, s]`` or ``[b, 2, s]``."""
    model = tiny(block)
    position_ids = POSITIONS_3D if positions == "3d" else POSITIONS_3D[:, 0]
    with torch.no_grad():
        ours = model(IDS, position_ids=position_ids, attention_mask=SEP).logits
        (reference,) = GLMModel.forward(model.glm, IDS, position_ids, SEP)
    torch.testing.assert_close(ours, reference, rtol=0, atol=0)


def test_without_block_positions_the_block_row_is_unused():
    model = tiny(block_position_encoding=False)
    with torch.no_grad():
        (three,) = model.glm(IDS, POSITIONS_3D, SEP)
        (two,) = model.glm(IDS, POSITIONS_3D[:, 0], SEP)
    torch.testing.assert_close(three, two, rtol=0, atol=0)


def test_hf_forward_runs_glm_model_forward(monkeypatch):
    """Cached or not, the transformers forward computes nothing of its own but the loss."""
    model = tiny()
    calls = []
    original = GLMModel.forward

    def recorded(self, *args, **kwargs):
        calls.append(kwargs.get("cache"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(GLMModel, "forward", recorded)
    cache = DynamicCache()
    with torch.no_grad():
        model(IDS, position_ids=POSITIONS_3D, attention_mask=SEP)
        model(IDS, position_ids=POSITIONS_3D, attention_mask=SEP, cache=cache, use_cache=True)
    assert calls == [None, cache]


def test_sep_counts_the_cached_positions():
    """A cached prefix, then the rest: sep is absolute (cached keys count), as in one forward over all."""
    model = tiny()
    with torch.no_grad():
        whole = model(IDS, position_ids=POSITIONS_3D, attention_mask=SEP).logits
        cache = DynamicCache()
        first = model(IDS[:, :5], position_ids=POSITIONS_3D[..., :5], attention_mask=SEP, cache=cache,
                      use_cache=True).logits
        rest = model(IDS[:, 5:], position_ids=POSITIONS_3D[..., 5:], attention_mask=SEP, cache=cache,
                     use_cache=True).logits
    torch.testing.assert_close(torch.cat((first, rest), dim=1), whole, rtol=1e-5, atol=1e-5)


def test_visibility_mask_with_cached_positions_is_the_full_masks_last_rows():
    full = visibility_mask(SEP, batch_size=2, query_length=7)
    assert torch.equal(visibility_mask(SEP, batch_size=2, query_length=2, cached_length=5), full[:, :, 5:])
    assert visibility_mask(None, 2, 3, cached_length=4).shape == (2, 1, 3, 7)


def test_mems_and_a_cache_do_not_combine():
    model = tiny()
    memory = torch.zeros(2, 3, 32)
    with pytest.raises(ValueError, match="mems"):
        model.glm(IDS, POSITIONS_3D, SEP, memory, memory, cache=DynamicCache())
