"""GLM's layout for a (source, target) pair: what finetuning trains on and generation starts from.

As THUDM's Hugging Face tokenizer and PaddleNLP's GLM recipe lay it out::

    Part A   [CLS] source [gMASK] [eos]        positions 0..a-1, block positions 0 (bidirectional)
    Part B   [sop] target                      positions: the [gMASK]'s; block positions 1..n (causal)
    labels   target [eop]                      loss on Part B only

The source is cut to fit ``src_length`` (Part A included), the target to ``tgt_length`` (Part B
included); ``attention_mask`` is the ``sep`` form (Part A's length).
"""

from __future__ import annotations

import numpy as np

from glm_port.data._renamed import renamed
from glm_port.training import Encoded, pad_batch  # noqa: F401  (the trainers' sample and batch)


def encode_source(tokenizer, source_ids: list[int], src_length: int) -> list[int]:
    """Part A: ``[CLS] source [gMASK] [eos]``, the source cut so that the whole fits ``src_length``."""
    if src_length < 4:
        raise ValueError(f"src_length must be at least 4 (room for [CLS], [gMASK], [eos] and one token), not {src_length}")
    return [tokenizer.cls_id, *source_ids[: src_length - 3], tokenizer.gmask_id, tokenizer.eos_id]


def encode_pair(tokenizer, source_ids: list[int], target_ids: list[int] | None, src_length: int,
                tgt_length: int) -> Encoded:
    """One sample in GLM's generation layout; ``target_ids=None`` gives the prompt alone (Part A + [sop])."""
    part_a = encode_source(tokenizer, source_ids, src_length)
    mask_position = len(part_a) - 2  # the [gMASK]
    target = list(target_ids or [])
    truncated = len(target) > tgt_length - 1
    target = target[: tgt_length - 1]
    part_b = [tokenizer.sop_id, *target] if target_ids is not None else [tokenizer.sop_id]
    labels = [*target, tokenizer.eop_id] if target_ids is not None else [0]
    a, n = len(part_a), len(part_b)
    positions = np.concatenate([np.arange(a), np.full(n, mask_position)])
    block_positions = np.concatenate([np.zeros(a, dtype=np.int64), np.arange(1, n + 1)])
    loss_mask = np.concatenate([np.zeros(a), np.ones(n) if target_ids is not None else np.zeros(n)])
    return Encoded(
        text=np.asarray(part_a + part_b, dtype=np.int64),
        position_id=np.stack([positions, block_positions]).astype(np.int64),
        sep=a,
        target=np.asarray([0] * a + labels, dtype=np.int64),
        loss_mask=loss_mask.astype(np.float32),
        truncated_target=truncated,
    )


__getattr__ = renamed(__name__, {"collate": "pad_batch"}, globals())  # the name before issue 27
