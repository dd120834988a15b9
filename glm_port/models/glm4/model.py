"""GLM-4-9B's model: ChatGLM2's network (``glm_port.models.chatglm2.model``), read with a GLM-4 config.

THUDM's ``modeling_chatglm.py`` for glm-4-9b-chat has ChatGLM2's block: RMSNorm, multi-query attention in 2
key/value groups with bias on the fused QKV, rotary embedding on the first half of each head in interleaved
pairs, SwiGLU, an untied output layer; the rotary base is ``10000 * rope_ratio`` (``rope_ratio`` 500 for
glm-4-9b-chat), which ChatGLM2's ``rotary_cos_sin`` already reads. Parameter names are THUDM's, so a GLM-4
directory's weights load as they are (``glm_port.models.glm4.weights``). What GLM-4 adds is its chat API
(``chat`` / ``stream_chat`` in GLM-4's role-token format, ``glm_port.models.glm4.chat``).
"""

from __future__ import annotations

from glm_port.models.chatglm2.model import ChatGLM2ForCausalLM
from glm_port.models.glm4.config import GLM4Config


class GLM4ForCausalLM(ChatGLM2ForCausalLM):
    """GLM-4 with its LM head: ``generate``, ``chat``, ``stream_chat`` and training, as ChatGLM2's."""

    config_class = GLM4Config
    config: GLM4Config

    # THUDM's chat API in GLM-4's format: [gMASK]<sop>, <|role|> messages, a reply after <|assistant|>.
    def chat(self, tokenizer, query: str, history=None, role: str = "user", **generate_kwargs):
        from glm_port.models.glm4.chat import chat

        return chat(self, tokenizer, query, history, role, **generate_kwargs)

    def stream_chat(self, tokenizer, query: str, history=None, role: str = "user", past_key_values=None,
                    return_past_key_values: bool = False, **generate_kwargs):
        from glm_port.models.glm4.chat import stream_chat

        return stream_chat(self, tokenizer, query, history, role, past_key_values=past_key_values,
                           return_past_key_values=return_past_key_values, **generate_kwargs)


__all__ = ["GLM4ForCausalLM"]
