"""GLM-4-9B's architecture as data: THUDM's ``config.json`` field names (``model_type`` "chatglm"), read as they are.

GLM-4 is ChatGLM2's network (``glm_port.models.chatglm2``) at another size, with a rotary base scaled by
``rope_ratio`` (``base = 10000 * rope_ratio``, THUDM's ``RotaryEmbedding.forward_impl``). ``GLM4Config`` is
``ChatGLM2Config`` with glm-4-9b-chat's ``config.json`` values as defaults: 40 layers, hidden 4096, ffn
13696, 32 heads of 128 in 2 key/value groups, ``padded_vocab_size`` 151552, ``seq_length`` 131072,
``rope_ratio`` 500, ``layernorm_epsilon`` 1.5625e-07, generation ending at ``<|endoftext|>``, ``<|user|>`` or
``<|observation|>`` (151329, 151336, 151338; pad 151329).
"""

from __future__ import annotations

from glm_port.models.chatglm2.config import ChatGLM2Config

# glm-4-9b-chat's config.json (THUDM), the fields that differ from ChatGLM2Config's defaults.
GLM4_9B_CHAT = dict(
    num_layers=40, padded_vocab_size=151552, hidden_size=4096, ffn_hidden_size=13696, kv_channels=128,
    num_attention_heads=32, multi_query_group_num=2, seq_length=131072, layernorm_epsilon=1.5625e-07,
    rope_ratio=500, eos_token_id=[151329, 151336, 151338], pad_token_id=151329,
    original_rope=True,  # unused by the math, but THUDM's modeling_chatglm.py reads it: its ChatGLMConfig has no default
)


class GLM4Config(ChatGLM2Config):
    """Shape of a GLM-4 model (THUDM's ``ChatGLMConfig`` fields; defaults = glm-4-9b-chat's config.json)."""

    model_type = "chatglm"  # as THUDM's GLM-4 directories say; glm_port.models.glm4.detect tells them apart

    def __init__(self, **kwargs):
        for name, value in GLM4_9B_CHAT.items():
            kwargs.setdefault(name, list(value) if isinstance(value, list) else value)
        super().__init__(**kwargs)


# The embedded tiny GLM-4 (glm_port.models.glm4.tiny): GLM-4's layout, rope_ratio included, at a width that runs
# instantly. The vocabulary and the end ids come from the tokenizer built with it.
TINY = dict(
    num_layers=2, hidden_size=64, ffn_hidden_size=160, kv_channels=16, num_attention_heads=4,
    multi_query_group_num=2, seq_length=512, rope_ratio=500,
)

__all__ = ["GLM4Config", "GLM4_9B_CHAT", "TINY"]
