"""Models written on shim (one folder per family under ``glm_port.models``) and the commands that use them.

Shared pieces sit beside the families: ``training`` (optimizer, schedule, precision, step),
``checkpoint_io`` (saving and loading), ``distributed`` (ranks and groups), ``data`` (tokenizers and
blank-infilling data); ``pretrain_glm`` is ``glm-pretrain``.
"""

from glm_port.models.glm import GLMConfig, GLMModel

__all__ = ["GLMConfig", "GLMModel"]
