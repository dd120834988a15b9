"""GLM's state-dict adapter (``weights_io.Adapter``): its checkpoints' names <-> its model's.

Upstream GLM saves ``checkpoint['module']`` with its own names (``word_embeddings.weight``,
``transformer.layers.N.attention.query_key_value.weight``); THUDM's Hugging Face files carry the same names, with
or without the ``glm.`` prefix its remote code's ``base_model_prefix`` adds; the model's state dict has them under
``glm.`` (``GLMForConditionalGeneration.glm``). So a checkpoint name is upstream's name (``to_checkpoint``, which
also takes either spelling of a file's name to upstream's), and the model's is that under ``glm.``
(``to_model``). The split plan (``splits.SPLIT_PLAN``) is written in upstream's names.
"""

from __future__ import annotations

from glm_port.models.glm.model import HF_PREFIX
from glm_port.models.weights_io import Adapter


def upstream_name(name: str) -> str:
    """Upstream's name for a file's or the model's tensor name (a leading ``glm.`` removed)."""
    return name[len(HF_PREFIX):] if name.startswith(HF_PREFIX) else name


def model_name(name: str) -> str:
    """The model's state-dict name for a checkpoint's tensor name (either spelling)."""
    return HF_PREFIX + upstream_name(name)


ADAPTER = Adapter(to_model=model_name, to_checkpoint=upstream_name)

__all__ = ["ADAPTER", "model_name", "upstream_name"]
