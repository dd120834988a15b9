"""GLM-4-9B (THUDM ``glm-4-9b-chat`` / ``glm-4-9b``): its tiktoken tokenizer and chat format so far (docs/glm4.md).

Not registered as a family yet: the model, weights and family declaration come with issue 27's contract.
"""

from glm_port.models.glm4.tokenizer import GLM4Tokenizer

__all__ = ["GLM4Tokenizer"]
