"""GLM-4-9B (THUDM ``glm-4-9b-chat`` / ``glm-4-9b``): glm_port's third model family (docs/glm4.md).

ChatGLM2's network (``glm_port.models.chatglm2``) with GLM-4's config (``rope_ratio``), its tiktoken tokenizer
and chat format. Directories are told from ChatGLM2's by ``detect.is_glm4`` (both say ``model_type: chatglm``);
transformers' native ``GlmForCausalLM`` layout (``model_type: glm``) loads too.
"""

from glm_port.models.glm4.config import GLM4Config
from glm_port.models.glm4.model import GLM4ForCausalLM
from glm_port.models.glm4.tokenizer import GLM4Tokenizer

FAMILY = "glm4"
MODEL_TYPES = ("chatglm", "glm")  # config.json "model_type" values of GLM-4 directories (THUDM's, transformers')

__all__ = ["FAMILY", "GLM4Config", "GLM4ForCausalLM", "GLM4Tokenizer", "MODEL_TYPES"]
