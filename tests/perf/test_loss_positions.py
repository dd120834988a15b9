"""Logits only where the loss counts: the same loss and the same gradients as upstream's full logits."""

import pytest

import shim as torch
import shim.nn.functional as F
from glm_port import GLMConfig, GLMModel
from glm_port.training import lm_loss

CONFIG = GLMConfig(vocab_size=256, num_layers=2, hidden_size=32, num_attention_heads=4, max_sequence_length=16,
                   embedding_dropout_prob=0.0, attention_dropout_prob=0.0, output_dropout_prob=0.0)


def blank_infilling_batch(batch=3, seq=16, vocab=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    sep = torch.tensor([5, 9, 16])[:batch]  # the last sample has no Part B: its loss mask is empty
    columns = torch.arange(seq).expand(batch, seq)
    return {
        "text": torch.randint(0, vocab, (batch, seq), generator=g),
        "target": torch.randint(0, vocab, (batch, seq), generator=g),
        "loss_mask": (columns >= sep[:, None]).float() * torch.rand(batch, seq, generator=g).gt(0.3),
        "attention_mask": sep,
        "position_id": torch.stack([columns, (columns - sep[:, None] + 1).clamp(min=0)], dim=1),
    }


def full_logits_loss(model, batch):
    logits, *_ = model(batch["text"], batch["position_id"], batch["attention_mask"])
    losses = F.cross_entropy(logits.flatten(0, 1), batch["target"].flatten(), reduction="none")
    mask = batch["loss_mask"].flatten()
    return (losses * mask).sum() / mask.sum()


def gradients(model, loss):
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("seed", [0, 1])
def test_loss_and_gradients_equal_the_full_logits_computation(seed):
    torch.manual_seed(seed)
    model = GLMModel(CONFIG)
    batch = blank_infilling_batch(seed=seed)
    reference = full_logits_loss(model, batch)
    expected = gradients(model, reference)
    loss, value = lm_loss(model, batch)
    got = gradients(model, loss)
    torch.testing.assert_close(value, reference.detach(), rtol=1e-5, atol=1e-6)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=1e-4, atol=1e-7, msg=name)


def test_logit_positions_select_rows_of_the_full_logits():
    torch.manual_seed(0)
    model = GLMModel(CONFIG).eval()
    batch = blank_infilling_batch()
    counted = batch["loss_mask"] != 0
    args = batch["text"], batch["position_id"], batch["attention_mask"]
    selected, = model(*args, logit_positions=counted)
    full, = model(*args)
    assert selected.shape == (int(counted.sum()), CONFIG.vocab_size)
    torch.testing.assert_close(selected, full[counted])
