"""GLM (THUDM/GLM): config, model, attention mask, weight names. Its declaration is ``spec.FAMILY``."""

from glm_port.models.glm.config import GLMConfig
from glm_port.models.glm.model import GLMModel

__all__ = ["GLMConfig", "GLMModel"]
