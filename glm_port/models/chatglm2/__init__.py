"""ChatGLM2 / ChatGLM3 (THUDM's ``modeling_chatglm.py`` layout): the second model family of glm_port. Its
declaration is ``spec.FAMILY``."""

from glm_port.models.chatglm2.config import ChatGLM2Config
from glm_port.models.chatglm2.model import ChatGLM2ForCausalLM, ChatGLM2Model

__all__ = ["ChatGLM2Config", "ChatGLM2ForCausalLM", "ChatGLM2Model"]
