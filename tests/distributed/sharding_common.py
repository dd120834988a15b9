"""What the sharding checks (test_sharding.py: FSDP2 on 2 ranks; test_sharding_tensor_parallel.py: FSDP2 x
tensor parallel 2 on 4 ranks) share: the tiny GLM, its batches, the optimizer settings, the split of a global
batch over the data-parallel ranks, and a recorder of the clip's norm.

fp32, no dropout: each data-parallel rank trains on its half of a global batch; a one-process reference
(run on every rank, from the same initial weights) trains on the whole batch.
"""

import torch

from glm_port.models.glm import GLMConfig
from glm_port.training import OptimizerSettings

CONFIG = GLMConfig(vocab_size=96, num_layers=2, hidden_size=32, num_attention_heads=2, max_sequence_length=24,
                   embedding_dropout_prob=0.0, attention_dropout_prob=0.0, output_dropout_prob=0.0)
STEPS, BATCH, LENGTH = 4, 4, 16  # global batch of 4: 2 per data-parallel rank
CLIP = 0.05  # low enough that the clip acts every step


def glm_batch(step: int) -> dict:
    """A GLM batch (2-D positions, ``sep`` as the attention mask), the same on every rank for ``step``."""
    g = torch.Generator().manual_seed(100 + step)
    text = torch.randint(0, CONFIG.vocab_size, (BATCH, LENGTH), generator=g)
    sep = torch.randint(4, LENGTH - 4, (BATCH,), generator=g)
    position = torch.arange(LENGTH).expand(BATCH, LENGTH)
    block = (position - sep[:, None] + 1).clamp(min=0)
    loss_mask = (position >= sep[:, None]).long()
    return {"text": text, "position_id": torch.stack([position.minimum(sep[:, None]), block], 1),
            "attention_mask": sep, "target": torch.roll(text, -1, 1), "loss_mask": loss_mask}


def half(batch: dict, rank: int, ranks: int = 2) -> dict:
    """Data-parallel rank ``rank``'s share of a global batch."""
    per_rank = BATCH // ranks
    return {k: v[rank * per_rank:(rank + 1) * per_rank] for k, v in batch.items()}


def settings() -> OptimizerSettings:
    return OptimizerSettings(lr=3e-3, weight_decay=0.01, warmup=0.0, decay_iters=STEPS)


def record_norms(env) -> list:
    """The norms ``env``'s clip returns from now on, as floats, appended to the list returned."""
    norms, clip = [], env.clip_grad_norm

    def recorded(parameters, max_norm):
        norm = clip(parameters, max_norm)
        norms.append(float(norm))
        return norm

    env.clip_grad_norm = recorded
    return norms


def assert_same_norms(norms: list, ref_norms: list) -> None:
    """The clip's norm each step is one process's (1e-5): every element counted once; and the clip acted."""
    assert len(norms) == len(ref_norms) == STEPS
    for step, (a, b) in enumerate(zip(norms, ref_norms)):
        assert abs(a - b) <= 1e-5 * max(b, 1.0), f"step {step}: gradient norm {a} != one process's {b}"
    assert min(ref_norms) > CLIP


def assert_same_losses(losses: list, ref_losses: list, tolerance: float = 1e-4) -> None:
    assert len(set(losses)) == len(losses)  # it trains (each step a new loss)
    for step, (a, b) in enumerate(zip(losses, ref_losses)):
        assert abs(a - b) <= tolerance, f"step {step}: sharded loss {a} != one-process loss {b}"
