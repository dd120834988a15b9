"""GLM's tensor-parallel split plan (Megatron's split rules), the one table its layers are built by
(``model.py``) and its weights are sliced and merged by (``weights.py``: loading at any tensor-parallel size,
glm-merge, glm-pretrain's and glm-finetune's shards).

The fused Q|K|V weight and bias split per third (``stride=3``: rank ``r`` holds ``[Q_r; K_r; V_r]``,
upstream's ``mp_rank`` layout); the word embeddings and ``dense_h_to_4h`` by rows (dim 0);
``attention.dense`` and ``dense_4h_to_h`` weights by columns (dim 1, their biases whole); everything else
is replicated. The plan does not depend on the config (``split_plan`` takes one for the families'
common signature).
"""

from __future__ import annotations

from shim.nn.split_plan import Split, SplitPlan

SPLIT_PLAN = SplitPlan.of((
    (r"word_embeddings\.weight$", Split(0)),
    (r"attention\.query_key_value\.(weight|bias)$", Split(0, stride=3)),
    (r"mlp\.dense_h_to_4h\.(weight|bias)$", Split(0)),
    (r"attention\.dense\.weight$", Split(1)),
    (r"mlp\.dense_4h_to_h\.weight$", Split(1)),
))


def split_plan(config=None, size: int = 1) -> SplitPlan:
    """GLM's plan: the same for every config and tensor-parallel size."""
    return SPLIT_PLAN


def layer_split(layer_idx: int, name: str) -> dict:
    """``Linear1D``'s split arguments for layer ``layer_idx``'s linear ``name`` (``"attention.dense"``), read
    from the plan's entry for its weight."""
    return SPLIT_PLAN.layer_kwargs(f"transformer.layers.{layer_idx}.{name}.weight")
