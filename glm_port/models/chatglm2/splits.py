"""ChatGLM2's tensor-parallel split plan: the one table its layers are built by (``model.py``) and THUDM's
tensors are sliced and merged by (``weights.tensor_parallel_slice`` / ``tensor_parallel_merge``: loading
under tensor parallel, glm-finetune's shards, glm-merge).

- ``query_key_value`` rows: rank ``r`` holds ``[Q_r; K_r; V_r]``. With multi-query attention THUDM's rows
  are ``[Q | K | V]`` blocks (``H d``, ``G d``, ``G d``), each cut over the ranks; with more ranks ``T``
  than key/value groups ``G`` (a multiple of them) each group is held by ``T / G`` neighbouring ranks, the
  ranks whose query heads are that group's (``section_replicas``). Without it THUDM's rows are per head
  ``[q_h; k_h; v_h]``: a contiguous run of heads a rank.
- ``dense_h_to_4h`` rows: ``[gate | up]``, each half cut (``stride=2``): rank ``r`` holds ``[gate_r; up_r]``.
- ``self_attention.dense`` and ``dense_4h_to_h`` weights: columns (their biases whole).
- everything else (the embedding, the norms, the output layer) is whole on every rank.

The sections depend on the config and the replication on the tensor-parallel size: ``split_plan(config,
size)`` builds the table.
"""

from __future__ import annotations

from shim.nn.split_plan import Split, SplitPlan


def qkv_split(config, size: int) -> Split:
    """``query_key_value``'s split under tensor parallel ``size``."""
    if not config.multi_query_attention:  # per-head [q; k; v] blocks: a contiguous run of heads a rank
        return Split(0)
    d, heads, groups = config.kv_channels, config.num_attention_heads, config.num_key_value_heads
    copies = size // groups if size > groups else 1
    return Split(0, sections=(heads * d, groups * d, groups * d), section_replicas=(1, copies, copies))


def split_plan(config, size: int = 1) -> SplitPlan:
    """ChatGLM2's plan for ``config`` under tensor parallel ``size`` (module docstring). The patterns are
    found anywhere in a name (a LoRA or quantized layer's tensors under the same linear split alike)."""
    return SplitPlan.of((
        (r"\.query_key_value\.", qkv_split(config, size)),
        (r"\.dense_h_to_4h\.", Split(0, stride=2)),
        (r"\.self_attention\.dense\.weight$", Split(1)),
        (r"\.dense_4h_to_h\.weight$", Split(1)),
    ))


def layer_split(config, size: int, layer_idx: int, name: str) -> dict:
    """``Linear1D``'s split arguments for layer ``layer_idx``'s linear ``name`` (``"mlp.dense_h_to_4h"``),
    read from the plan's entry for its weight."""
    return split_plan(config, size).layer_kwargs(f"transformer.encoder.layers.{layer_idx}.{name}.weight")
