"""ChatGLM2 / ChatGLM3 (THUDM's ``modeling_chatglm.py`` layout): the second model family of glm_port."""

from glm_port.models.chatglm2.config import ChatGLM2Config
from glm_port.models.chatglm2.model import ChatGLM2ForCausalLM, ChatGLM2Model

FAMILY = "chatglm2"
MODEL_TYPES = ("chatglm",)  # config.json "model_type" values this family reads

__all__ = ["FAMILY", "MODEL_TYPES", "ChatGLM2Config", "ChatGLM2ForCausalLM", "ChatGLM2Model"]
