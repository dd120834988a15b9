"""GLM's weight names: upstream's keys, and the ``glm.`` prefix Hugging Face GLM checkpoints add.

THUDM's converter saves upstream's ``checkpoint['module']`` as it is; its remote code's
``base_model_prefix = "glm"`` nests the same keys under ``glm.`` when it saves again. Both load.
"""

from __future__ import annotations

HF_PREFIX = "glm."


def without_hf_prefix(weights: dict) -> dict:
    """``weights`` with upstream's key names (a leading ``glm.`` removed)."""
    return {k[len(HF_PREFIX):] if k.startswith(HF_PREFIX) else k: v for k, v in weights.items()}


def strip_hf_prefix(module, state_dict, prefix, *args) -> None:
    """``load_state_dict`` pre-hook: accept ``glm.``-prefixed keys as they are."""
    for key in [k for k in state_dict if k.startswith(prefix + HF_PREFIX)]:
        state_dict[prefix + key[len(prefix + HF_PREFIX):]] = state_dict.pop(key)
