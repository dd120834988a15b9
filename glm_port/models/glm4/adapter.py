"""GLM-4's state-dict adapters: ChatGLM2's, since GLM-4 is ChatGLM2's network under ChatGLM2's names.

THUDM's GLM-4 layout (``model_type: chatglm``) stores the model's names (``ADAPTER``: the constant rotary buffer
dropped); transformers' native ``glm`` layout (``model_type: glm``, glm-4-9b-chat-hf) renames them and splits the
fused ``query_key_value`` into ``q|k|v_proj``: ``from_glm_plan`` reads it as ours, ``to_glm_plan`` writes ours as
it (``chatglm2/adapter.py``).
"""

from __future__ import annotations

from glm_port.models.chatglm2.adapter import ADAPTER, IGNORED_KEYS, from_glm_plan, to_glm_plan

__all__ = ["ADAPTER", "IGNORED_KEYS", "from_glm_plan", "to_glm_plan"]
