"""GLM written on shim: the model (upstream's parameter names and numerics) and ``glm-pretrain``."""

from glm_port.config import GLMConfig
from glm_port.model import GLMModel

__all__ = ["GLMConfig", "GLMModel"]
