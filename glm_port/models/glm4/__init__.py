"""GLM-4-9B (THUDM ``glm-4-9b-chat`` / ``glm-4-9b``): glm_port's third model family (docs/glm4.md).

ChatGLM2's network (``glm_port.models.chatglm2``) with GLM-4's config (``rope_ratio``), its tiktoken tokenizer
and chat format. Directories are told from ChatGLM2's by ``detect.is_glm4`` (both say ``model_type: chatglm``);
transformers' native ``GlmForCausalLM`` layout (``model_type: glm``) loads too.

Its declaration is ``spec.FAMILY``. The classes below load on first use, so that importing one module of the
folder (``detect.py``, ``tokenizer.py``) loads no other (tiktoken, ChatGLM2's model).
"""

import importlib

_LAZY = {"GLM4Config": "glm_port.models.glm4.config", "GLM4ForCausalLM": "glm_port.models.glm4.model",
         "GLM4Tokenizer": "glm_port.models.glm4.tokenizer"}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["GLM4Config", "GLM4ForCausalLM", "GLM4Tokenizer"]
